package kubeone

import (
	"errors"
	"net"
	"strconv"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/store"
)

// HubLive is Live for a running hub: where its bastion listens, and the
// host keys its nodes' sessions present now (see the pinning note in
// manifest.go).
type HubLive struct {
	// BastionAddr is the bastion's address as local clients dial it;
	// BastionKey what it presents (its host certificate).
	BastionAddr string
	BastionKey  gossh.PublicKey
	// Conns are the hub's live node sessions.
	Conns *nodeconn.Table
}

// Bastion implements Live.
func (l HubLive) Bastion() (Bastion, error) {
	host, port, err := net.SplitHostPort(l.BastionAddr)
	if err != nil {
		return Bastion{}, err
	}
	p, err := strconv.Atoi(port)
	if err != nil || l.BastionKey == nil {
		return Bastion{}, errors.New("hub: the bastion's address or host key is not known")
	}
	return Bastion{Host: host, Port: p, HostKey: l.BastionKey.Marshal()}, nil
}

// HostKey is the node's current host certificate, or its plain host key
// if it has none (a node whose key the hub could not certify presents the
// plain key).
func (l HubLive) HostKey(n store.Node) ([]byte, bool) {
	c, ok := l.Conns.Get(n.Name)
	if !ok || c.NodeID != n.ID {
		return nil, false
	}
	c.PushMu.Lock()
	line := c.Pushed.HostCert
	c.PushMu.Unlock()
	if line == "" {
		line = c.HostKey
	}
	if line == "" {
		return nil, false
	}
	k, _, _, _, err := gossh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return nil, false
	}
	return k.Marshal(), true
}

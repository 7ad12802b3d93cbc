package hub

import (
	"errors"
	"net"
	"strconv"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/kubeone"
	"github.com/tether-dev/tether/hub/store"
)

// kubeoneLive tells the KubeOne service what only the running hub knows:
// where its bastion listens, and the host keys presented now (see the
// pinning note in hub/kubeone/manifest.go).
type kubeoneLive struct {
	s *Server
	// bastionAddr is the bastion's address as local clients dial it;
	// bastionKey what it presents (its host certificate).
	bastionAddr string
	bastionKey  gossh.PublicKey
}

func (l kubeoneLive) Bastion() (kubeone.Bastion, error) {
	host, port, err := net.SplitHostPort(l.bastionAddr)
	if err != nil {
		return kubeone.Bastion{}, err
	}
	p, err := strconv.Atoi(port)
	if err != nil || l.bastionKey == nil {
		return kubeone.Bastion{}, errors.New("hub: the bastion's address or host key is not known")
	}
	return kubeone.Bastion{Host: host, Port: p, HostKey: l.bastionKey.Marshal()}, nil
}

// HostKey is the node's current host certificate, or its plain host key
// if it has none (a node whose key the hub could not certify presents the
// plain key).
func (l kubeoneLive) HostKey(n store.Node) ([]byte, bool) {
	c, ok := l.s.reg.Get(n.Name)
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

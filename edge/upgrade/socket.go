package upgrade

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// SocketName is the running agent's confirm socket in its state dir
// (0600; the agent also checks that the peer is root, SO_PEERCRED).
const SocketName = "upgrade.sock"

// SocketRequest is one request on the confirm socket: Op "list" (the
// upgrades awaiting confirmation) or "confirm" (Name).
type SocketRequest struct {
	Op   string `json:"op"`
	Name string `json:"name,omitempty"`
}

// SocketReply answers a SocketRequest.
type SocketReply struct {
	Upgrades []State `json:"upgrades,omitempty"`
	Error    string  `json:"error,omitempty"`
}

// ErrNoAgent: no running agent serves the confirm socket.
var ErrNoAgent = errors.New("no running agent")

// ErrNotRoot: the confirm socket answers root only.
var ErrNotRoot = errors.New("only root may confirm upgrades on this node")

// ServeConfirm serves the confirm socket until ctx ends. onChange gets
// the records a confirmation changed (the agent reports them to the hub).
func (n *Node) ServeConfirm(ctx context.Context, onChange func([]State)) error {
	path := filepath.Join(n.Dir, SocketName)
	_ = os.Remove(path) // a stale socket of an agent that died
	// No umask around the bind: the umask is the whole process's, and
	// every file or directory another goroutine created meanwhile would
	// get its mask (seen as a 0600 directory elsewhere in the process).
	// Until the chmod below the socket's mode follows the umask, which is
	// harmless: a connection whose peer is not root is refused anyway
	// (the SO_PEERCRED check below).
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return fmt.Errorf("confirm socket: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("confirm socket: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("confirm socket: %w", err)
		}
		wg.Go(func() {
			defer c.Close()
			n.serveConn(c, onChange)
		})
	}
}

func peerUID(c *net.UnixConn) (uint32, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *syscall.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return cred.Uid, nil
}

func (n *Node) serveConn(c *net.UnixConn, onChange func([]State)) {
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	enc := json.NewEncoder(c)
	// The request is read before the peer is checked, so that a refused
	// client reads the refusal instead of a broken pipe; it is bounded and
	// nothing of it is acted on.
	var req SocketRequest
	derr := json.NewDecoder(io.LimitReader(c, 4096)).Decode(&req)
	uid, err := peerUID(c)
	if err != nil || uid != 0 {
		n.log().Warn("confirm socket: refused a non-root peer", "uid", uid, "err", err)
		_ = enc.Encode(SocketReply{
			Error: fmt.Sprintf("%s (asked by uid %d): run `sudo tether-edge confirm`", ErrNotRoot, uid),
		})
		return
	}
	if derr != nil {
		_ = enc.Encode(SocketReply{Error: "bad request: " + derr.Error()})
		return
	}
	var rep SocketReply
	switch req.Op {
	case "list":
		rep.Upgrades, err = n.Waiting()
	case "confirm":
		host, _ := os.Hostname()
		var s *State
		s, err = n.Confirm(req.Name, "root@"+host+" (on the node)")
		if err == nil {
			rep.Upgrades = []State{*s}
			n.log().Info("upgrade confirmed on the node", "name", s.Name, "by", s.ConfirmedBy)
			if onChange != nil {
				onChange(rep.Upgrades)
			}
		}
	default:
		err = fmt.Errorf("unknown op %q", req.Op)
	}
	if err != nil {
		rep.Error = err.Error()
	}
	_ = enc.Encode(rep)
}

// Ask sends one request to the agent's confirm socket in dir.
func Ask(ctx context.Context, dir string, req SocketRequest) ([]State, error) {
	path := filepath.Join(dir, SocketName)
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	switch {
	case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ECONNREFUSED):
		return nil, fmt.Errorf(
			"%w serves %s: confirmation goes through the running agent; start it (systemctl start tether-edge) and try again",
			ErrNoAgent, path)
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return nil, fmt.Errorf("%w: %s is root's: run `sudo tether-edge confirm`", ErrNotRoot, path)
	case err != nil:
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return nil, err
	}
	var rep SocketReply
	if err := json.NewDecoder(bufio.NewReader(io.LimitReader(c, 1<<20))).Decode(&rep); err != nil {
		return nil, fmt.Errorf("confirm socket %s: %w", path, err)
	}
	if rep.Error != "" {
		if rest, ok := strings.CutPrefix(rep.Error, ErrNotRoot.Error()); ok {
			return nil, fmt.Errorf("%w%s", ErrNotRoot, rest)
		}
		return nil, errors.New(rep.Error)
	}
	return rep.Upgrades, nil
}

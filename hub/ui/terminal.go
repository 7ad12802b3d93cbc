package ui

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/internal/validate"
	"github.com/tether-dev/tether/pki"
)

// TerminalRequest asks the hub for a shell on a node.
type TerminalRequest struct {
	Caller     access.Caller
	Node       string
	Login      string
	Cols, Rows int
	Remote     string
}

// Shell is a shell on a node with a pseudo-terminal.
type Shell interface {
	// Write sends keystrokes (Ctrl-C is byte 3: the node's terminal
	// turns it into SIGINT).
	io.Writer
	// Output is what the terminal prints.
	Output() io.Reader
	Resize(cols, rows int) error
	// Wait returns when the shell exits.
	Wait() error
	Close() error
}

// terminalRecheck is how often a terminal re-asks whether its operator may
// still log in on the node (removed operator, revoked key, narrowed roles,
// a login no role allows any more, a removed or revoked node).
const terminalRecheck = 5 * time.Second

// termMsg is one message from the browser: the first authenticates
// (csrf), later ones carry input or a resize.
type termMsg struct {
	CSRF string `json:"csrf,omitempty"`
	Type string `json:"type,omitempty"` // input | resize
	Data string `json:"data,omitempty"`
	Cols int    `json:"cols,omitempty"`
	Rows int    `json:"rows,omitempty"`
}

// terminal serves GET /ui/api/terminal?node=N&login=L as a WebSocket: the
// browser's xterm.js on one side, a shell on the node on the other, opened
// by the hub through the one door (Hub.OpenTerminal). The WebSocket
// handshake is same-origin only (the library checks Origin); its first
// message must carry the session's CSRF token.
func (c *Console) terminal(w http.ResponseWriter, r *http.Request, s *signedIn) {
	node, login := r.URL.Query().Get("node"), r.URL.Query().Get("login")
	if err := pki.ValidateName(node); err != nil {
		writeErr(w, http.StatusBadRequest, "node: "+err.Error())
		return
	}
	if err := validate.Login(login); err != nil {
		writeErr(w, http.StatusBadRequest, "login: "+err.Error())
		return
	}
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return // Accept answered the browser
	}
	defer ws.CloseNow()
	ws.SetReadLimit(64 << 10)
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)

	fail := func(msg string) {
		b, _ := json.Marshal(map[string]string{"type": "error", "error": msg})
		_ = ws.Write(ctx, websocket.MessageText, b)
		_ = ws.Close(websocket.StatusPolicyViolation, "refused")
	}
	var first termMsg
	if err := readJSON(ctx, ws, &first); err != nil {
		return
	}
	if subtle.ConstantTimeCompare([]byte(first.CSRF), []byte(s.sess.CSRF)) != 1 {
		c.cfg.Audit(store.AuditEvent{Kind: "console_csrf", Operator: whoOf(s.sess.Operator), Remote: r.RemoteAddr,
			Result: "refused", Detail: "terminal to " + node + ": CSRF token missing or wrong"})
		fail("CSRF token missing or wrong: reload the console")
		return
	}
	start := time.Now()
	rec := store.AuditEvent{
		At:       start,
		Kind:     "console_terminal",
		Operator: whoOf(s.sess.Operator),
		Node:     node,
		Remote:   r.RemoteAddr,
		Detail:   "login " + login,
	}
	sh, err := c.cfg.Hub.OpenTerminal(ctx, TerminalRequest{
		Caller: s.caller,
		Node:   node,
		Login:  login,
		Cols:   first.Cols,
		Rows:   first.Rows,
		Remote: r.RemoteAddr,
	})
	if err != nil {
		rec.Result, rec.EndedAt, rec.Detail = terminalResult(err), time.Now(), rec.Detail+": "+err.Error()
		c.cfg.Audit(rec)
		fail(err.Error())
		return
	}
	defer sh.Close()
	// A row at the start too: a terminal the hub's end cuts short is on
	// record all the same.
	started := rec
	started.Result = "started"
	c.cfg.Audit(started)
	c.cfg.Logger.Info("console terminal opened", "operator", rec.Operator, "node", node, "login", login)

	var toNode, fromNode atomic.Int64
	done := make(chan struct{})
	go func() { // node → browser; ends when the shell's output does
		defer close(done)
		buf := make([]byte, 32<<10)
		out := sh.Output()
		for {
			n, err := out.Read(buf)
			if n > 0 {
				fromNode.Add(int64(n))
				if werr := ws.Write(ctx, websocket.MessageBinary, buf[:n]); werr != nil {
					cancel(werr)
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	go func() { // browser → node
		for {
			var m termMsg
			if err := readJSON(ctx, ws, &m); err != nil {
				cancel(err)
				return
			}
			switch m.Type {
			case "input":
				toNode.Add(int64(len(m.Data)))
				if _, err := io.WriteString(sh, m.Data); err != nil {
					cancel(err)
					return
				}
			case "resize":
				if m.Cols > 0 && m.Rows > 0 && m.Cols <= 1000 && m.Rows <= 1000 {
					_ = sh.Resize(m.Cols, m.Rows)
				}
			}
		}
	}()
	tick := time.NewTicker(terminalRecheck)
	defer tick.Stop()
	result := "ok"
loop:
	for {
		select {
		case <-done:
			break loop
		case <-ctx.Done():
			break loop
		case <-tick.C:
			if err := c.stillMay(ctx, r, node, login); err != nil {
				result = "ended: access withdrawn"
				rec.Detail += ": " + err.Error()
				fail("access withdrawn: " + err.Error())
				break loop
			}
		}
	}
	sh.Close()
	if result == "ok" {
		b, _ := json.Marshal(map[string]string{"type": "exit"})
		_ = ws.Write(context.Background(), websocket.MessageText, b)
		_ = ws.Close(websocket.StatusNormalClosure, "shell exited")
	}
	rec.Result, rec.EndedAt, rec.BytesToNode, rec.BytesFromNode = result, time.Now(), toNode.Load(), fromNode.Load()
	c.cfg.Audit(rec)
	c.cfg.Logger.Info("console terminal closed", "operator", rec.Operator, "node", node, "result", result,
		"bytes_to_node", rec.BytesToNode, "bytes_from_node", rec.BytesFromNode)
}

// stillMay re-checks a live terminal as the bastion re-checks a live
// jump: the session still stands (its operator registered, with the key
// it signed in with), the node is neither removed nor revoked, and the
// door still lets the operator log in there as login. A node that cannot
// be looked up keeps its terminal: the store may be briefly unavailable.
func (c *Console) stillMay(ctx context.Context, r *http.Request, node, login string) error {
	s, err := c.signedIn(r)
	if err != nil {
		return err
	}
	n, _, err := c.cfg.Door.Resolve(ctx, access.ByName(node))
	switch {
	case err == nil || errors.Is(err, access.ErrOffline):
	case errors.Is(err, access.ErrUnknownNode), errors.Is(err, access.ErrRevoked):
		return err
	default:
		c.cfg.Logger.Warn("live terminal not re-checked: node lookup failed",
			"operator", s.caller.Operator, "node", node, "err", err)
		return nil
	}
	_, err = c.cfg.Door.AuthorizeTerminal(s.caller.Operator, login, n)
	return err
}

func terminalResult(err error) string {
	switch {
	case errors.Is(err, access.ErrDenied), errors.Is(err, access.ErrRevoked), errors.Is(err, access.ErrUnknownNode):
		return "denied"
	case errors.Is(err, access.ErrOffline):
		return "offline"
	}
	return "failed"
}

func readJSON(ctx context.Context, ws *websocket.Conn, v any) error {
	typ, b, err := ws.Read(ctx)
	if err != nil {
		return err
	}
	if typ != websocket.MessageText {
		return errors.New("terminal: want text messages")
	}
	return json.Unmarshal(b, v)
}

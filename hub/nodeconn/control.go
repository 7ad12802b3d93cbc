package nodeconn

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// heartbeat tells an agent that announced control.CapHeartbeat that the hub
// still hears it. The hub sends one at once (it arms the agent's watchdog),
// then one in answer to each of the agent's heartbeats (every
// Liveness().Every), from readControl: an idle session then costs one
// exchange per interval and the hub no timer per session. An answer proves
// more than a timer's beat: the agent's last heartbeat got through.
func heartbeat(c *Conn) error { return c.SendHeartbeat() }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// readControl reads the agent's control messages until the session ends or
// the agent falls silent; answer says the agent takes heartbeats (see
// heartbeat).
func (s *Server) readControl(ctx context.Context, conn *Conn, ctrl tunnel.Stream, answer bool, log *slog.Logger) {
	lastStored := time.Now()
	live := s.Liveness()
	for {
		// An agent heartbeats every live.Every (the welcome says so); one
		// silent for live.Deadline is gone, or its link is half-open: close
		// the session explicitly, before the transport's idle timeout would
		// end it silently, so the agent hears of it if its side still works.
		// A TransportLive agent heartbeats only when its own keepalive
		// setting is longer than this hub's (control.Liveness.AgentHeartbeats),
		// and its transport ends a session whose agent fell silent: a
		// timeout here is the transport's idle timeout.
		if !conn.TransportLive {
			_ = ctrl.SetReadDeadline(time.Now().Add(live.Deadline))
		}
		msg, err := control.Read(ctrl)
		if isTimeout(err) {
			if conn.TransportLive {
				log.Warn("nothing heard from the node; its tunnel's idle timeout ended the session", "silent_for", live.HubIdle)
			} else {
				log.Warn("no heartbeat from the node; closing its session", "silent_for", live.Deadline)
			}
			return
		}
		if err != nil {
			select {
			case <-conn.Session.Done():
			default:
				if !errors.Is(err, io.EOF) {
					log.Info("control stream ended", "err", err)
				}
				if errors.Is(err, control.ErrBadMessage) {
					s.auditSession(conn.Session, conn.Name, "control stream closed: "+err.Error())
				}
			}
			return
		}
		switch msg.Type {
		case control.TypeHeartbeat:
			conn.Heard.Store(time.Now().UnixNano())
			if answer && heartbeat(conn) != nil {
				return // the session is going: the agent no longer reads
			}
			// Throttle store writes: last_seen at heartbeat granularity is
			// plenty. A TransportLive agent's is the presence sweep's to write.
			if !conn.TransportLive && time.Since(lastStored) >= seenStoreInterval {
				lastStored = time.Now()
				s.markSeen(ctx, log, conn.NodeID, store.Seen{Online: true, At: lastStored})
			}
		case control.TypeSSHEvent:
			s.recordSSHEvent(conn, msg.SSHEvent, log)
		case upgradeproto.TypeState:
			s.cfg.Watcher.UpgradeStates(ctx, conn, msg.UpgradeStates, log)
		case control.TypeRenew:
			if err := s.renewNodeCert(ctx, conn, msg.CSR, log); err != nil {
				log.Warn("certificate renewal refused", "err", err)
				s.cfg.Audit.Refusal(
					"renew",
					conn.Session.RemoteAddr().String(),
					store.AuditEvent{Kind: "renew", Node: conn.Name, Result: "refused", Detail: err.Error()},
				)
				_ = conn.Send(&control.Message{Type: control.TypeNotice, Notice: "certificate renewal refused: " + err.Error()})
			}
		default:
			if handled, err := s.cfg.Sites.Dispatch(ctx, conn, msg); handled {
				if err != nil {
					log.Warn("site broke the site protocol; closing its session", "err", err)
					return
				}
				continue
			}
			log.Warn("unexpected control message from agent; closing session", "type", msg.Type)
			s.auditSession(
				conn.Session,
				conn.Name,
				fmt.Sprintf("control stream closed: unexpected %s message from the agent", msg.Type),
			)
			return
		}
	}
}

// renewNodeCert issues a fresh node certificate for the same key as the
// session's current one (the CSR signature proves possession), without
// touching the live tunnel. A revoked or removed node gets nothing.
func (s *Server) renewNodeCert(ctx context.Context, conn *Conn, csrDER []byte, log *slog.Logger) error {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return fmt.Errorf("parse CSR: %w", err)
	}
	cur := conn.Session.ConnectionState().PeerCertificates[0]
	if pk, ok := cur.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !pk.Equal(csr.PublicKey) {
		return errors.New("the CSR is not for this node's key")
	}
	n, err := s.cfg.Store.GetNode(ctx, conn.NodeID)
	if err != nil {
		return err
	}
	if !n.RevokedAt.IsZero() {
		return errors.New("node is revoked")
	}
	chain, err := s.cfg.IssueNode(ctx, csrDER, pki.Identity{Kind: pki.KindNode, ID: n.ID}, n.Name, s.cfg.NodeCertTTL)
	if err != nil {
		return err
	}
	cert := chain[0]
	if err := s.cfg.Store.UpdateNodeCert(ctx, n.ID, cert.SerialNumber.Text(16), cert.NotAfter); err != nil {
		return err
	}
	if err := conn.Send(&control.Message{Type: control.TypeRenewed, Cert: string(pki.EncodeCerts(chain...))}); err != nil {
		return err
	}
	s.cfg.Audit.Write(
		store.AuditEvent{
			At:     time.Now(),
			Kind:   "renew",
			Node:   n.Name,
			Remote: conn.Session.RemoteAddr().String(),
			Result: "ok",
			Detail: "serial " + cert.SerialNumber.Text(16) + ", valid until " + cert.NotAfter.UTC().Format(time.RFC3339),
		},
	)
	log.Info("node certificate renewed", "valid_until", cert.NotAfter)
	return nil
}

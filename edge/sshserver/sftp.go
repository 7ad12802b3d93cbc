package sshserver

import (
	"context"

	"github.com/gliderlabs/ssh"
	"github.com/pkg/sftp"
)

// handleSFTP serves the "sftp" subsystem, which is also what scp uses since
// OpenSSH 9. Files are accessed as the agent's user; relative paths start
// in its home directory.
func (s *Server) handleSFTP(sess ssh.Session) {
	sctx, ok := sess.Context().(*sessionContext)
	if !ok || !sctx.state.tasks.add() {
		return
	}
	st := sctx.state
	defer st.tasks.done()
	log := st.log.With("user", sess.User(), "kind", "sftp")
	log.Info("session started")

	srv, err := sftp.NewServer(
		newSymlinkFilter(sctx.rawChannel(), s.user.dir), sftp.WithServerWorkingDirectory(s.user.dir),
	)
	if err != nil {
		log.Warn("sftp server", "err", err)
		sess.Exit(1)
		return
	}
	// Closing the channel is the only way to stop Serve early.
	stop := context.AfterFunc(sctx, func() { srv.Close() })
	err = srv.Serve()
	stop()
	log.Info("session ended", "err", err)
	if err != nil {
		sess.Exit(1)
		return
	}
	sess.Exit(0)
}

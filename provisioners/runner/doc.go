// Package runner is the hub's SSH client for provisioning: it runs commands
// and scripts and uploads files on edge nodes, over a byte stream the hub
// opens through the node's tunnel (DialFunc).
//
// # Trust
//
// There is no trust-on-first-use. A node must present an SSH host
// certificate signed by one of the hub's host CAs (Config.HostCAs, asked on
// every Connect so a CA rotation takes effect at once) that names the node
// explicitly among its principals; a plain host key, a certificate from
// another CA, or one issued for another node fails with ErrHostKey. The hub
// authenticates with a short-lived user certificate it signs per job
// (Auth.Signer); a refusal is ErrAuth.
//
// # Why every command runs under a wrapper
//
// A provisioning step that times out or is cancelled must not leave its
// processes running on the node: a half-finished package install that keeps
// going while the job engine retries it is worse than a failed step. The SSH
// protocol has no reliable way to say "kill this command and everything it
// started":
//
//   - OpenSSH's sshd runs a command without a PTY in a new POSIX session
//     (setsid) and, when the client closes the channel or the connection
//     drops, does not kill it: the command keeps running, reparented to init.
//   - A "signal" channel request is unreliable: OpenSSH 9.2 refuses it for
//     root sessions ("session signalling requires privilege separation");
//     a process may ignore the signal; and a dropped connection carries
//     nothing.
//   - The agent's embedded server (edge/sshserver) kills the whole session
//     when the channel closes, but a node may run a real sshd instead.
//
// So the command line sent to a node's sshd is
//
//	exec /bin/sh -c '<wrapper>' tether-run '<script-to-remove>' <argv of the user command>...
//
// and the wrapper, not the SSH server, enforces the lifetime. It inherits the
// session's process group (sshd and edge/sshserver both make the session
// process a group leader) and
//
//  1. keeps the channel's stdin on a spare descriptor and starts a watchdog
//     that reads it. The runner never writes to stdin and keeps it open for
//     as long as the command should live, so end-of-file means "stop": the
//     runner cancelled (it closes stdin), the hub's connection dropped or the
//     hub died (sshd closes the pipe when it loses the connection), or the
//     wrapper itself exited (sshd closes the pipe once the session's process
//     is gone). The watchdog then kills the whole group with SIGKILL. Its own
//     stdout and stderr go to /dev/null, so it never holds the channel open;
//  2. runs the user command in the background, in the same group, with stdin
//     from /dev/null;
//  3. traps TERM, HUP and INT (the runner sends TERM on cancel) and answers
//     them with SIGKILL to the whole group, since a user command may ignore
//     TERM and its children would outlive it;
//  4. waits for the user command and exits with its status. Whatever the
//     command left behind in the group is then killed by the watchdog (on
//     sshd, which closes stdin when the session's process exits) or by
//     edge/sshserver's session cleanup, so a step never leaves background
//     processes behind on either server, and a leftover that holds the
//     channel's stdout cannot keep the step from finishing.
//
// The agent's embedded server (it announces itself as "SSH-2.0-Tether")
// does all of this itself when asked (the "kill-on-end@tether.dev" session
// request, sent before the exec; without it that server only hangs up a
// session's leftovers, as sshd does), so there the line is just
// "exec <argv>": stdin is closed right after the start (the command reads an empty stdin, as from
// /dev/null), a cancelled command gets signal KILL, and the server kills
// whatever is left in its session when that process is gone. A step costs
// the node one process instead of three, which is what a fan-out to many
// small nodes pays for.
//
// On cancellation or deadline, under the wrapper, Run sends signal TERM, closes stdin, waits
// Config.KillGrace for the channel to close and then closes it; if even that
// gets no answer (a dead link), it closes the whole connection. Closing
// stdin alone kills the command on both servers (it is what works on sshd,
// which drops the signal for root); the signal is a second path where the
// server honours it (edge/sshserver), and closing the session or the
// connection also ends in EOF on stdin. The tests cover deadline, cancel
// and the hub's connection dropping mid-command on both servers.
//
// Processes that deliberately leave the group (setsid, daemons that
// double-fork) escape, as with any supervisor; that is how a step starts a
// service that must outlive it (better: through the init system).
//
// # Environment and scripts
//
// Environment variables are not sent as "env" requests, which sshd drops
// unless AcceptEnv lists them, but passed on the command line through
// env(1), single-quoted. Scripts are uploaded over SFTP to a fresh
// /tmp/.tether-run-<random> file created with O_EXCL and mode 0700, run by
// their #! interpreter (or /bin/sh) named explicitly, so a noexec /tmp does
// not matter, and removed afterwards by the wrapper and again by the runner.
//
// # Uploads
//
// Upload writes to a temporary file in the destination directory, has the
// node compute its SHA-256 (sha256sum over the same connection) and compares
// it with what was sent before renaming it over the destination with
// posix-rename, so the destination is either untouched or complete and
// verified.
package runner

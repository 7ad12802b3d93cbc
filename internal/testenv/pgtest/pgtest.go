// Package pgtest runs throwaway PostgreSQL servers for tests: Debian's
// postgresql package (initdb + postgres) in a temporary directory, as an
// unprivileged user, on a loopback port and a unix socket in that
// directory. One server is shared by the tests of a process, each test
// getting a fresh database (DSN); a test that restarts its server starts
// its own (Start).
//
// It is apart from testenv because testenv imports the hub's store, whose
// own tests need PostgreSQL too; testenv re-exports it (postgres.go).
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// T is the part of testing.TB the helpers use.
type T interface {
	Helper()
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Cleanup(func())
	Name() string
}

// ErrNotInstalled is returned where PostgreSQL's server binaries are not
// installed (scripts/ensure-deps.sh installs the postgresql package).
var ErrNotInstalled = errors.New(
	"PostgreSQL server not installed (apt-get install postgresql, or scripts/ensure-deps.sh)",
)

// BinDir finds initdb and postgres: $TETHER_PG_BIN, else the newest
// /usr/lib/postgresql/*/bin (Debian), else PATH.
func BinDir() (string, error) {
	if d := os.Getenv("TETHER_PG_BIN"); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", ErrNotInstalled
}

func pgMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// Server is one running PostgreSQL cluster.
type Server struct {
	Dir  string // root of the cluster: data/, the socket, the log
	Port int    // on 127.0.0.1
	bin  string
	cred *syscall.Credential // nil: run as ourselves

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
	seq    atomic.Int64
}

// Start initialises and starts a new cluster in a fresh temporary
// directory. The caller stops it (Stop).
func Start() (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	sweepStale()
	dir, err := os.MkdirTemp("", "tether-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	s := &Server{Dir: dir, bin: bin}
	// PostgreSQL refuses to run as root: tests running as root run the
	// server as the postgres system user (or nobody) on a directory given
	// to that user.
	if os.Getuid() == 0 {
		if s.cred, err = serverUser(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: %w", err)
		}
	}
	initdb := s.command(filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"), "-U", "tether",
		"--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	if out, err := initdb.CombinedOutput(); err != nil {
		// A permission error here has been seen once and not reproduced:
		// say what the server user was up against.
		diag := ""
		if errors.Is(err, os.ErrPermission) {
			diag = "\n" + permissions(s.cred, filepath.Join(bin, "initdb"), dir, filepath.Dir(dir))
		}
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: initdb: %w\n%s%s", err, out, diag)
	}
	if err := s.StartServer(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// sweepStale removes the directories of clusters whose test process died
// without cleaning up (a panic, a kill): their server died with it
// (Pdeathsig), its files stayed.
func sweepStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "tether-pg-*"))
	for _, d := range dirs {
		fi, err := os.Stat(d)
		if err != nil || time.Since(fi.ModTime()) < time.Minute {
			continue // maybe another process's cluster starting
		}
		b, err := os.ReadFile(filepath.Join(d, "data", "postmaster.pid"))
		if err == nil {
			pid, _ := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
			if pid > 0 && syscall.Kill(pid, 0) == nil {
				continue // its server is running
			}
		}
		os.RemoveAll(d)
	}
}

// permissions describes the modes and owners of paths, for an error.
func permissions(cred *syscall.Credential, paths ...string) string {
	var b strings.Builder
	if cred != nil {
		fmt.Fprintf(&b, "running as uid %d gid %d; ", cred.Uid, cred.Gid)
	}
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v; ", p, err)
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			fmt.Fprintf(&b, "%s: %v uid %d gid %d; ", p, fi.Mode(), st.Uid, st.Gid)
		}
	}
	return b.String()
}

func serverUser() (*syscall.Credential, error) {
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("pgtest: running as root and neither the postgres nor the nobody user exists to run the server")
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = s.Dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	// The server dies with the test process, even on a panic or a kill:
	// SIGQUIT is PostgreSQL's immediate shutdown, which also ends its
	// backends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGQUIT, Credential: s.cred}
	return cmd
}

// StartServer starts the cluster's server (again, after StopServer) and
// waits until it accepts connections. A fresh cluster picks a free port;
// a restart keeps it.
func (s *Server) StartServer() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("pgtest: server already running")
	}
	var lastErr error
	for range 5 {
		if s.Port == 0 || lastErr != nil {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return fmt.Errorf("pgtest: pick a port: %w", err)
			}
			s.Port = l.Addr().(*net.TCPAddr).Port
			l.Close()
		}
		if lastErr = s.startLocked(); lastErr == nil {
			return nil
		}
	}
	return lastErr
}

func (s *Server) startLocked() error {
	logf, err := os.OpenFile(filepath.Join(s.Dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if s.cred != nil {
		os.Chown(logf.Name(), int(s.cred.Uid), int(s.cred.Gid))
	}
	args := []string{"-D", filepath.Join(s.Dir, "data"),
		"-p", strconv.Itoa(s.Port), "-k", s.Dir, "-c", "listen_addresses=127.0.0.1",
		"-c", "max_connections=300", "-c", "shared_buffers=32MB"}
	// A test cluster trades durability for speed, unless a benchmark wants
	// the figures of a durable server (TETHER_PG_DURABLE=1).
	if os.Getenv("TETHER_PG_DURABLE") == "" {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	cmd := s.command(filepath.Join(s.bin, "postgres"), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := pgx.Connect(ctx, s.AdminDSN())
		cancel()
		if err == nil {
			c.Close(context.Background())
			s.cmd, s.exited = cmd, exited
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("pgtest: postgres exited at start: %s", s.logTail())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			return fmt.Errorf("pgtest: postgres not accepting connections after 60s: %v\n%s", err, s.logTail())
		}
	}
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "server.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// StopServer stops the server (fast shutdown: sessions are cut) and waits
// for it to exit; the cluster's files stay for StartServer.
func (s *Server) StopServer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	}
	s.cmd, s.exited = nil, nil
}

// Stop stops the server and removes its directory.
func (s *Server) Stop() {
	s.StopServer()
	os.RemoveAll(s.Dir)
}

// AdminDSN is the URL of the cluster's maintenance database.
func (s *Server) AdminDSN() string { return s.DSNFor("postgres") }

// DSNFor is the URL of database db on the server (TCP on loopback, no TLS).
func (s *Server) DSNFor(db string) string {
	return fmt.Sprintf("postgres://tether@127.0.0.1:%d/%s?sslmode=disable", s.Port, db)
}

// CreateDB creates a fresh database named after prefix and returns its
// URL.
func (s *Server) CreateDB(prefix string) (string, error) {
	name := fmt.Sprintf("%s_%d", sanitize(prefix), s.seq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.AdminDSN())
	if err != nil {
		return "", fmt.Errorf("pgtest: connect: %w", err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, `CREATE DATABASE `+name); err != nil {
		return "", fmt.Errorf("pgtest: create database %s: %w", name, err)
	}
	return s.DSNFor(name), nil
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
		if b.Len() >= 40 {
			break
		}
	}
	return "t_" + b.String()
}

var (
	sharedOnce sync.Once
	shared     *Server
	sharedErr  error
)

// Shared is the process's shared server, started on first use.
func Shared() (*Server, error) {
	sharedOnce.Do(func() { shared, sharedErr = Start() })
	return shared, sharedErr
}

// StopShared stops the shared server if it was started; TestMain calls it
// after m.Run (the server dies with the process anyway).
func StopShared() {
	if shared != nil {
		shared.Stop()
	}
}

// Main runs the tests of m and then stops the shared server: a package's
// TestMain is `os.Exit(pgtest.Main(m))`.
func Main(m interface{ Run() int }) int {
	code := m.Run()
	StopShared()
	return code
}

type skipper interface {
	Skipf(format string, args ...any)
}

// DSN returns the URL of a fresh database on the shared server for t. The
// test is skipped (with the reason) only where PostgreSQL is not
// installed; any other failure fails it.
func DSN(t T) string {
	t.Helper()
	s := Need(t)
	dsn, err := s.CreateDB(t.Name())
	if err != nil {
		t.Fatalf("%v", err)
	}
	return dsn
}

// Need returns the shared server, skipping t where PostgreSQL is not
// installed.
func Need(t T) *Server {
	t.Helper()
	s, err := Shared()
	if errors.Is(err, ErrNotInstalled) {
		if sk, ok := t.(skipper); ok {
			sk.Skipf("PostgreSQL tests skipped: %v", err)
		}
	}
	if err != nil {
		t.Fatalf("%v", err)
	}
	return s
}

// Own starts a server for t alone (for a test that stops and restarts
// it), stopped at t's end.
func Own(t T) *Server {
	t.Helper()
	s, err := Start()
	if errors.Is(err, ErrNotInstalled) {
		if sk, ok := t.(skipper); ok {
			sk.Skipf("PostgreSQL tests skipped: %v", err)
		}
	}
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

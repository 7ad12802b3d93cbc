package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/hub"
	"github.com/tether-dev/tether/hub/kubeone"
	"github.com/tether-dev/tether/hub/leader"
	"github.com/tether-dev/tether/hub/stepca"
	"github.com/tether-dev/tether/tunnel"
)

func newHubCmd() *cobra.Command {
	cfg := hub.Config{}
	tc := tunnel.DefaultConfig()
	var caMode string
	var step stepca.Config
	var parentTransport string
	cmd := &cobra.Command{
		Use:   "hub",
		Short: "Run the hub: tunnel endpoint, SSH bastion and API",
		Long: `Run the Tether hub.

One port (--listen) carries the agents' tunnels (UDP: QUIC; TCP: TLS 1.3 with
ALPN tether/1) and the HTTPS API and join endpoint (TCP, ALPN h2/http1.1).
Operators jump through the SSH bastion on --ssh-listen.

The data dir holds the CA (ca/), the database (tether.db, unless --store names
a PostgreSQL database), the SSH host key,
and a local admin identity (admin/) that other tether commands on this machine
use with --data-dir. Keep it private (it is created 0700).

Site hubs: with --parent JOIN_STRING (from 'tether site token create' on the
parent hub) and --site NAME, this hub also joins the parent as site NAME: it
keeps one tunnel up to the parent (the agent's transports, backoff and
certificate renewal), reports its status every --site-status-interval and its
nodes, and keeps serving its own nodes and operators when the parent is
unreachable. The identity at the parent is kept in DATA_DIR/parent, so a
restart needs no token (the spent join string may stay on the command line).
Every hub takes sites below it: 'tether sites' lists them.

Go runtime: the hub collects garbage at GOGC=50 (with more headroom while it
relays), and after 10 s below a fifth of a core it schedules goroutines on one
thread (GOMAXPROCS=1), back to every core within a quarter second of load.
GOGC or GOMAXPROCS in the environment turns the matching policy off.`,
		Example: `  tether hub --data-dir ./hub --listen 127.0.0.1:7443 --ssh-listen 127.0.0.1:2222
  tether hub --data-dir /var/lib/tether --listen :7443 --advertise hub.example.com:7443
  tether hub --data-dir /var/lib/tether --store 'postgres://tether@db.example.com/tether?sslmode=verify-full' \
      --peer-listen :7444 --advertise hub.example.com:7443
  tether hub --data-dir /var/lib/tether --parent "$SITE_JOIN" --site berlin    # a site hub below a parent`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger()
			if err != nil {
				return err
			}
			cfg.Logger = log
			cfg.Tunnel = tc
			if cfg.ResumeWindow == 0 {
				cfg.ResumeWindow = -1 // the flag's 0 turns resuming off; the Config's 0 is the default
			}
			if cfg.Site.Transport, err = tunnel.ParseTransport(parentTransport); err != nil {
				return fmt.Errorf("--parent-transport: %w", err)
			}
			switch caMode {
			case "own":
			case "step-ca":
				cfg.StepCA = &step
			default:
				return fmt.Errorf("--ca %q: want own or step-ca", caMode)
			}
			s, err := hub.New(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			return s.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.DataDir, "data-dir", defaultDataDir(), "hub state directory")
	f.StringVar(&cfg.Store, "store", "",
		`where the hub's state lives: a SQLite file (PATH or sqlite:PATH), or `+
			`"postgres://USER@HOST/DB?sslmode=verify-full" shared by several hub replicas (default: DATA_DIR/tether.db); `+
			`put a password in ~/.pgpass or PGPASSWORD, not in the URL`)
	f.StringVar(&cfg.Listen, "listen", ":7443", "tunnel + API address (UDP and TCP, same port)")
	f.StringVar(&cfg.SSHListen, "ssh-listen", ":2222", "SSH bastion address for operators")
	f.StringSliceVar(&cfg.SSHCiphers, "ssh-ciphers", nil, "comma-separated SSH ciphers the bastion offers every "+
		"operator's client, in order (default: chosen per client: on a CPU with AES-GCM instructions, where a relay "+
		"costs the hub about 0.6× the CPU of chacha20-poly1305, aes128-gcm@openssh.com,aes256-gcm@openssh.com to an "+
		"OpenSSH client that has them; x/crypto's list, from which the client picks, to every other client, e.g. "+
		"paramiko, and on other CPUs)")
	f.StringSliceVar(&cfg.Advertise, "advertise", nil,
		"HOST:PORT agents should dial, put into join strings (repeatable; default: the --listen address, "+
			"or this host's name if it is a wildcard); a replica's join strings name every live replica's")
	f.DurationVar(&cfg.NodeCertTTL, "node-cert-ttl", 24*time.Hour,
		"lifetime of node certificates (agents renew at about 2/3 of it over the tunnel)")
	f.DurationVar(&cfg.HostCertTTL, "host-cert-ttl", 7*24*time.Hour,
		"lifetime of nodes' SSH host certificates (re-issued at 2/3)")
	f.DurationVar(&cfg.UserCertTTL, "user-cert-ttl", 8*time.Hour,
		"lifetime of operators' SSH user certificates from tether login")
	f.StringVar(&caMode, "ca", "own", `who issues node certificates: "own" (the hub's CA in DATA_DIR/ca) or "step-ca"`)
	f.StringVar(&step.URL, "step-ca-url", "", "with --ca step-ca: the step-ca URL, e.g. https://ca.example.com:9000")
	f.StringVar(&step.RootFile, "step-ca-root", "", "with --ca step-ca: the step-ca root certificate file")
	f.StringVar(&step.Provisioner, "step-ca-provisioner", "", "with --ca step-ca: name of a JWK provisioner")
	f.StringVar(&step.PasswordFile, "step-ca-password-file", "",
		"with --ca step-ca: file with the provisioner key's password")
	f.StringVar(&cfg.NodeSuffix, "node-suffix", "tether", "nodes answer to NAME and NAME.SUFFIX")
	f.StringVar(&cfg.ProvisionLogin, "provision-login", "root",
		"login the hub's jobs (tether run, cluster installs) use on nodes; a node label provision-login=NAME overrides it")
	f.Int64Var(&cfg.MaxUploadBytes, "max-upload-bytes", 1<<30, "largest file tether run --upload accepts")
	f.StringVar(&cfg.EnginesDir, "engines-dir", "",
		"directory of extra cluster engines (ENGINE/install.sh, ENGINE/uninstall.sh, optional ENGINE/engine.yaml); "+
			"built-in: k3s, rke2")
	f.StringVar(&cfg.KubeOne, "kubeone", "kubeone",
		"the kubeone binary `tether kubeone apply|reset` runs: a path, or a name looked up on PATH at each run")
	f.StringVar(&cfg.KubeOneAdminConf, "kubeone-admin-conf", kubeone.DefaultAdminConf,
		"where kubeadm writes the admin kubeconfig on control-plane nodes (`tether kubeone kubeconfig` reads it with sudo)")
	f.IntVar(&cfg.KubeAPIServerPort, "kube-apiserver-port", kubeone.DefaultAPIServerPort,
		"kube-apiserver's port on control-plane nodes' loopback (KubeOne cluster health, `tether kubeone proxy`)")
	f.StringVar(&cfg.RegistryCA, "registry-ca", "",
		"PEM file of extra CA certificates for OCI registries holding upgrade artifacts (system roots otherwise; "+
			"TLS verification cannot be turned off)")
	f.StringVar(&cfg.RegistryAuth, "registry-auth", "",
		"docker-style config.json with registry credentials (default: $DOCKER_CONFIG/config.json or ~/.docker/config.json "+
			"when present)")
	f.DurationVar(&cfg.LeaderTTL, "leader-ttl", leader.DefaultTTL,
		"with several hub replicas: life of the leader and replica leases; a dead leader's singletons move within 4/3 of it")
	f.StringVar(&cfg.PeerListen, "peer-listen", "",
		"run as one of several hub replicas sharing --store: serve peer links on ADDR (UDP and TCP), "+
			"take the shared identity from the store, forward streams to the replica holding a node")
	f.StringVar(&cfg.PeerAdvertise, "peer-advertise", "",
		"with --peer-listen: HOST:PORT other replicas dial (default: the --peer-listen address, "+
			"or this host's name if it is a wildcard)")
	f.StringVar(&cfg.ReplicaID, "replica-id", "",
		"this hub's replica ID, a DNS label (default: the one kept in DATA_DIR/replica-id, made on the first start)")
	f.DurationVar(&cfg.LeaseTTL, "replica-lease", 15*time.Second,
		"with --peer-listen: a replica that stops heartbeating (every third of this) stops counting as the holder of its "+
			"nodes' tunnels after this long")
	f.StringVar(&cfg.Site.ParentJoin, "parent", "",
		"site join string of the parent hub (from 'tether site token create' there): join it as a site, with --site; "+
			"needed only until DATA_DIR/parent holds the identity")
	f.StringVar(&cfg.Site.Name, "site", "",
		"this hub's site name at its --parent (a DNS label: nodes below it are NAME.SITE there)")
	f.DurationVar(&cfg.Site.StatusInterval, "site-status-interval", 10*time.Second,
		"how often a site hub reports its status to its parent; this hub shows its own sites stale after 3 times this "+
			"without a report")
	f.StringVar(&parentTransport, "parent-transport", "auto",
		"how the uplink to --parent dials: auto (QUIC raced against TCP), quic or tcp")
	f.DurationVar(&tc.KeepAliveInterval, "keepalive", tc.KeepAliveInterval,
		"tunnel keepalive interval: an agent pings its hub after a little more than this without hearing it, "+
			"or heartbeats at this interval if its own --keepalive is longer (at most about 25s keeps a QUIC agent's UDP NAT "+
			"binding open; docs/design/tunnels.md, Keepalive and windows)")
	f.DurationVar(&cfg.ResumeWindow, "resume-window", 60*time.Second,
		"how long a stream to a node (an ssh jump, a job, a forward) waits for the node to reconnect after its link "+
			"went down, then ends with the reason; the agent keeps its side as long (0 turns resuming off)")
	f.DurationVar(&tc.IdleTimeout, "dead-peer-timeout", tc.IdleTimeout,
		"a tunnel silent this long is considered dead (set on hub and agents alike; 3 × --keepalive by default)")
	return cmd
}

package store

// schemaVersion is the version this hub migrates a database to: one
// version per migration, so adding a migration is the only step.
var schemaVersion = len(migrations)

var migrations = []string{
	// v1
	`CREATE TABLE nodes (
		id TEXT PRIMARY KEY,
		name TEXT NOT NULL UNIQUE,
		labels TEXT NOT NULL DEFAULT '{}',
		hostname TEXT NOT NULL DEFAULT '',
		os TEXT NOT NULL DEFAULT '',
		arch TEXT NOT NULL DEFAULT '',
		machine_id TEXT NOT NULL DEFAULT '',
		agent_version TEXT NOT NULL DEFAULT '',
		transport TEXT NOT NULL DEFAULT '',
		online INTEGER NOT NULL DEFAULT 0,
		last_seen INTEGER NOT NULL DEFAULT 0,
		created_at INTEGER NOT NULL,
		cert_serial TEXT NOT NULL DEFAULT '',
		cert_expires INTEGER NOT NULL DEFAULT 0
	);
	CREATE TABLE tokens (
		id TEXT PRIMARY KEY,
		secret_hash BLOB NOT NULL,
		labels TEXT NOT NULL DEFAULT '{}',
		uses_left INTEGER NOT NULL,
		expires_at INTEGER NOT NULL,
		created_at INTEGER NOT NULL
	);
	CREATE TABLE operators (
		name TEXT PRIMARY KEY,
		public_key TEXT NOT NULL,
		fingerprint TEXT NOT NULL UNIQUE,
		created_at INTEGER NOT NULL
	);`,
	// v2: roles, operators' roles, node revocation, audit log.
	`CREATE TABLE roles (
		name TEXT PRIMARY KEY,
		nodes TEXT NOT NULL,
		logins TEXT NOT NULL
	);
	INSERT INTO roles (name, nodes, logins) VALUES ('all', '*', '["*"]');
	ALTER TABLE operators ADD COLUMN roles TEXT NOT NULL DEFAULT '["all"]';
	ALTER TABLE nodes ADD COLUMN revoked_at INTEGER NOT NULL DEFAULT 0;
	CREATE TABLE audit (
		id INTEGER PRIMARY KEY AUTOINCREMENT,
		at INTEGER NOT NULL,
		kind TEXT NOT NULL,
		operator TEXT NOT NULL DEFAULT '',
		node TEXT NOT NULL DEFAULT '',
		key_fingerprint TEXT NOT NULL DEFAULT '',
		remote TEXT NOT NULL DEFAULT '',
		result TEXT NOT NULL DEFAULT '',
		detail TEXT NOT NULL DEFAULT '',
		ended_at INTEGER NOT NULL DEFAULT 0,
		bytes_to_node INTEGER NOT NULL DEFAULT 0,
		bytes_from_node INTEGER NOT NULL DEFAULT 0
	);
	CREATE INDEX audit_at ON audit (at);
	-- The audit log is append-only: the database refuses edits and deletes.
	CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
	CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;`,
	// v3: keys of removed operators, published to managed sshd as RevokedKeys.
	`CREATE TABLE revoked_keys (
		fingerprint TEXT PRIMARY KEY,
		public_key TEXT NOT NULL,
		revoked_at INTEGER NOT NULL
	);`,
	// v4: jobs and per-node results, cluster memberships, API tokens.
	migrationV4,
	// v5: settings, the built-in role "admin" (admin.go).
	migrationAdmin,
	// v6: cluster memberships and job runs follow the node's ID, not its name.
	migrationNodeIDs,
	// v7: several keys per operator (operator_keys).
	migrationOperatorKeys,
	// v8: labels the agent reports, kept apart from the hub-set labels.
	migrationReportedLabels,
	// v9: whether a role allows port forwarding (existing roles keep the
	// default: allowed).
	`ALTER TABLE roles ADD COLUMN forwarding INTEGER NOT NULL DEFAULT 1;`,
	// v10: the facts of the node's latest hello (JSON), shown and used to
	// address the node on its own network (never for access decisions).
	`ALTER TABLE nodes ADD COLUMN facts TEXT NOT NULL DEFAULT '{}';`,
	// v11: KubeOne clusters and their members (kubeone.go).
	migrationKubeOne,
	// v12: onboarding of machines in the field: credentials, OS profiles,
	// and which machine each onboarded node is (onboarding.go).
	migrationOnboarding,
	// v13: over-the-air upgrades, each node's place in one, and the role
	// permission to confirm them (upgrades.go).
	migrationUpgrades,
	// v14: the web console's one-time sign-in codes and sessions
	// (console.go), so sessions outlive a hub restart.
	migrationConsole,
	// v15: hub replicas sharing the store: replicas, presence, shared
	// secrets (replicas.go).
	migrationReplicas,
	// v16: hub replicas: leases (singleton leadership with its fencing
	// epoch, replica liveness), the change feed, each job's owner replica.
	migrationSingletons,
	// v17: site hubs below this hub: what a join token registers (node or
	// site), the sites (each also a row in nodes), their inventories.
	migrationSites,
	// v18: desired state sent down the tree of hubs, the generations each
	// child site acknowledged, missions' per-node state (desired.go).
	migrationDesired,
	// v19: service tunnels between nodes and sites, their consumers, and
	// the roles' service permissions (services.go).
	migrationServices,
	// v20: each running job's last sign of life, where a hub that died
	// ends it (jobs.go).
	migrationJobAlive,
	// v21: the addresses agents dial for each hub replica (replicas.go).
	migrationReplicaHubs,
}

// migrationJobAlive adds the time a running job's hub last said it was
// alive: a job the hub's death interrupted ended then, not when a hub
// next started and found it, so its runs' durations leave the downtime
// out.
const migrationJobAlive = `ALTER TABLE jobs ADD COLUMN alive_at INTEGER NOT NULL DEFAULT 0;`

// migrationConsole adds the web console's sign-in codes and sessions. Both
// are stored by the SHA-256 of their secret only: a copy of the database
// signs nobody in.
const migrationConsole = `CREATE TABLE console_codes (
		hash TEXT PRIMARY KEY,
		operator TEXT NOT NULL,
		key_tag TEXT NOT NULL,
		admin INTEGER NOT NULL,
		created_at INTEGER NOT NULL,
		expires_at INTEGER NOT NULL
	);
	CREATE TABLE console_sessions (
		hash TEXT PRIMARY KEY,
		operator TEXT NOT NULL,
		key_tag TEXT NOT NULL,
		admin INTEGER NOT NULL,
		csrf TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		expires_at INTEGER NOT NULL
	);
	CREATE INDEX console_sessions_operator ON console_sessions (operator);`

// migrationReportedLabels adds the labels a node's agent reports about
// itself (its labels file). They live in their own column so no query that
// decides access (the labels column) can ever read them.
const migrationReportedLabels = `ALTER TABLE nodes ADD COLUMN reported_labels TEXT NOT NULL DEFAULT '{}';`

const migrationV4 = `CREATE TABLE jobs (
		id TEXT PRIMARY KEY,
		kind TEXT NOT NULL,
		spec TEXT NOT NULL,
		created_by TEXT NOT NULL DEFAULT '',
		role TEXT NOT NULL DEFAULT '',
		state TEXT NOT NULL,
		error TEXT NOT NULL DEFAULT '',
		created_at INTEGER NOT NULL,
		finished_at INTEGER NOT NULL DEFAULT 0
	);
	CREATE INDEX jobs_created ON jobs (created_at);
	CREATE TABLE job_nodes (
		job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
		node TEXT NOT NULL,
		state TEXT NOT NULL,
		exit_code INTEGER,
		error TEXT NOT NULL DEFAULT '',
		started_at INTEGER NOT NULL DEFAULT 0,
		finished_at INTEGER NOT NULL DEFAULT 0,
		log_head BLOB NOT NULL DEFAULT x'',
		log_tail BLOB NOT NULL DEFAULT x'',
		log_dropped INTEGER NOT NULL DEFAULT 0,
		log_bytes INTEGER NOT NULL DEFAULT 0,
		PRIMARY KEY (job_id, node)
	);
	CREATE TABLE cluster_members (
		node TEXT PRIMARY KEY,
		engine TEXT NOT NULL,
		desired TEXT NOT NULL,
		state TEXT NOT NULL,
		engine_digest TEXT NOT NULL DEFAULT '',
		last_transition INTEGER NOT NULL DEFAULT 0,
		last_error TEXT NOT NULL DEFAULT '',
		last_job TEXT NOT NULL DEFAULT '',
		updated_at INTEGER NOT NULL
	);
	CREATE TABLE api_tokens (
		id TEXT PRIMARY KEY,
		secret_hash BLOB NOT NULL,
		role TEXT NOT NULL,
		description TEXT NOT NULL DEFAULT '',
		created_at INTEGER NOT NULL,
		expires_at INTEGER NOT NULL DEFAULT 0
	);`

// migrationNodeIDs keys what belongs to a node by the node's ID. Before it, a
// machine joining under a removed node's name inherited that node's cluster
// membership and its waiting job runs. Names are mapped to IDs through the
// nodes table at migration time:
//   - a cluster member whose name has no node, or whose record was last
//     written before the node holding the name now joined (it belonged to an
//     earlier machine of that name), is dropped; a machine joining under the
//     name must be registered anew;
//   - a job run is tied to the node that held the name when the job was
//     created; a run whose node is gone keeps its row as history with an
//     empty node_id, and one still pending or waiting is ended as skipped
//     ("node removed") so it can never run on a newcomer.
const migrationNodeIDs = `CREATE TABLE cluster_members_by_id (
		node_id TEXT PRIMARY KEY REFERENCES nodes (id) ON DELETE CASCADE,
		engine TEXT NOT NULL,
		desired TEXT NOT NULL,
		state TEXT NOT NULL,
		engine_digest TEXT NOT NULL DEFAULT '',
		last_transition INTEGER NOT NULL DEFAULT 0,
		last_error TEXT NOT NULL DEFAULT '',
		last_job TEXT NOT NULL DEFAULT '',
		updated_at INTEGER NOT NULL
	);
	INSERT INTO cluster_members_by_id (node_id, engine, desired, state, engine_digest, last_transition, last_error, ` +
	`last_job, updated_at)
		SELECT n.id, m.engine, m.desired, m.state, m.engine_digest, m.last_transition, m.last_error, m.last_job, m.updated_at
		FROM cluster_members m JOIN nodes n ON n.name = m.node AND m.updated_at >= n.created_at;
	DROP TABLE cluster_members;
	ALTER TABLE cluster_members_by_id RENAME TO cluster_members;
	ALTER TABLE job_nodes ADD COLUMN node_id TEXT NOT NULL DEFAULT '';
	UPDATE job_nodes SET node_id = COALESCE((SELECT n.id FROM nodes n JOIN jobs j ON j.id = job_nodes.job_id
		WHERE n.name = job_nodes.node AND n.created_at <= j.created_at), '');
	UPDATE job_nodes SET state = 'skipped', error = '` + NodeRemovedReason + `'
		WHERE node_id = '' AND state IN ('pending', 'waiting');
	CREATE INDEX job_nodes_node_id ON job_nodes (node_id);`

// migrationOperatorKeys moves operators' keys into their own table, so an
// operator can hold several (a laptop and a workstation, or an old and a
// new key during a rotation). Every existing operator keeps its one key,
// added when the operator was. A key's fingerprint is unique across all
// operators, as it was, so a key names exactly one operator.
const migrationOperatorKeys = `CREATE TABLE operators_v7 (
		name TEXT PRIMARY KEY,
		created_at INTEGER NOT NULL,
		roles TEXT NOT NULL DEFAULT '["all"]'
	);
	INSERT INTO operators_v7 (name, created_at, roles) SELECT name, created_at, roles FROM operators;
	CREATE TABLE operator_keys (
		fingerprint TEXT PRIMARY KEY,
		operator TEXT NOT NULL REFERENCES operators_v7 (name) ON DELETE CASCADE,
		public_key TEXT NOT NULL,
		added_at INTEGER NOT NULL
	);
	INSERT INTO operator_keys (fingerprint, operator, public_key, added_at) SELECT fingerprint, name, public_key, ` +
	`created_at FROM operators;
	DROP TABLE operators;
	ALTER TABLE operators_v7 RENAME TO operators;
	CREATE INDEX operator_keys_operator ON operator_keys (operator);`

// migrationKubeOne adds KubeOne clusters: one row per cluster, one per
// member.
// A member row is keyed by its node's ID, so a node is in at most one
// KubeOne cluster, and it goes with its node (ON DELETE CASCADE) or its
// cluster.
const migrationKubeOne = `CREATE TABLE kubeone_clusters (
		name TEXT PRIMARY KEY,
		id TEXT NOT NULL UNIQUE,
		kubernetes TEXT NOT NULL,
		login TEXT NOT NULL,
		cni TEXT NOT NULL,
		extra TEXT NOT NULL DEFAULT '{}',
		public_key TEXT NOT NULL,
		status TEXT NOT NULL,
		last_apply_job TEXT NOT NULL DEFAULT '',
		last_apply_result TEXT NOT NULL DEFAULT '',
		last_apply_at INTEGER NOT NULL DEFAULT 0,
		created_at INTEGER NOT NULL,
		updated_at INTEGER NOT NULL
	);
	CREATE TABLE kubeone_members (
		node_id TEXT PRIMARY KEY REFERENCES nodes (id) ON DELETE CASCADE,
		cluster TEXT NOT NULL REFERENCES kubeone_clusters (name) ON DELETE CASCADE,
		role TEXT NOT NULL,
		position INTEGER NOT NULL
	);
	CREATE INDEX kubeone_members_cluster ON kubeone_members (cluster);`

// migrationUpgrades adds over-the-air upgrades: one row per rollout (the
// artifact pinned by digest at creation: a row without one cannot exist),
// one per target node (its step in the per-node state machine with each
// step's time and reason), and the roles' `confirm` permission.
const migrationUpgrades = `CREATE TABLE upgrades (
		name TEXT PRIMARY KEY,
		kind TEXT NOT NULL,
		reference TEXT NOT NULL,
		digest TEXT NOT NULL CHECK (length(digest) = 71 AND substr(digest, 1, 7) = 'sha256:'),
		version TEXT NOT NULL,
		pinned TEXT NOT NULL,
		spec TEXT NOT NULL,
		state TEXT NOT NULL,
		reason TEXT NOT NULL DEFAULT '',
		fetched INTEGER NOT NULL DEFAULT 0,
		created_by TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		updated_at INTEGER NOT NULL
	);
	CREATE TABLE upgrade_nodes (
		upgrade TEXT NOT NULL REFERENCES upgrades (name) ON DELETE CASCADE,
		node_id TEXT NOT NULL,
		node TEXT NOT NULL,
		batch INTEGER NOT NULL,
		step TEXT NOT NULL,
		reason TEXT NOT NULL DEFAULT '',
		from_version TEXT NOT NULL DEFAULT '',
		confirmed_by TEXT NOT NULL DEFAULT '',
		history TEXT NOT NULL DEFAULT '[]',
		job_id TEXT NOT NULL DEFAULT '',
		started_at INTEGER NOT NULL DEFAULT 0,
		updated_at INTEGER NOT NULL,
		PRIMARY KEY (upgrade, node_id)
	);
	CREATE INDEX upgrade_nodes_node_id ON upgrade_nodes (node_id);
	ALTER TABLE roles ADD COLUMN confirm INTEGER NOT NULL DEFAULT 0;`

// migrationSingletons adds what several hub replicas on one database
// coordinate with: named leases whose epoch fences a holder's writes, the
// change feed that carries access changes to every replica's live state,
// and the replica that runs each job (so a dead replica's jobs, and only
// those, are marked interrupted).
const migrationSingletons = `CREATE TABLE leases (
		name TEXT PRIMARY KEY,
		holder TEXT NOT NULL,
		epoch INTEGER NOT NULL,
		expires_at INTEGER NOT NULL
	);
	CREATE TABLE changes (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		kind TEXT NOT NULL,
		subject TEXT NOT NULL DEFAULT '',
		origin TEXT NOT NULL DEFAULT '',
		at INTEGER NOT NULL
	);
	ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT '';`

// migrationSites adds site hubs: a token's kind (a node token cannot
// register a site, nor a site token a node), one row per site below this
// hub (its node row is its certificate's identity), and each site's node
// inventory, named relative to the site and never a row of nodes.
const migrationSites = `ALTER TABLE tokens ADD COLUMN kind TEXT NOT NULL DEFAULT 'node';
	CREATE TABLE sites (
		node_id TEXT PRIMARY KEY REFERENCES nodes (id) ON DELETE CASCADE,
		name TEXT NOT NULL UNIQUE,
		hub_id TEXT NOT NULL DEFAULT '',
		path TEXT NOT NULL DEFAULT '',
		host_cas TEXT NOT NULL DEFAULT '[]',
		subtree TEXT NOT NULL DEFAULT '[]',
		status TEXT NOT NULL DEFAULT '',
		status_seq INTEGER NOT NULL DEFAULT 0,
		status_at INTEGER NOT NULL DEFAULT 0,
		disconnected_at INTEGER NOT NULL DEFAULT 0,
		joined_at INTEGER NOT NULL
	);
	CREATE TABLE site_nodes (
		site_id TEXT NOT NULL REFERENCES sites (node_id) ON DELETE CASCADE,
		site TEXT NOT NULL,
		name TEXT NOT NULL,
		id TEXT NOT NULL DEFAULT '',
		labels TEXT NOT NULL DEFAULT '{}',
		online INTEGER NOT NULL DEFAULT 0,
		last_seen INTEGER NOT NULL DEFAULT 0,
		transport TEXT NOT NULL DEFAULT '',
		revoked INTEGER NOT NULL DEFAULT 0,
		PRIMARY KEY (site_id, name)
	);`

// migrationServices adds service tunnels: one row per service (a node's
// allow-listed TCP port under a name; origin is the hub where it was
// created, target and consumers are named as that hub names them), one per
// consumer binding (a node listening on a loopback port for it), and the
// roles' permission to expose and connect services.
const migrationServices = `CREATE TABLE services (
		name TEXT PRIMARY KEY,
		origin TEXT NOT NULL,
		target TEXT NOT NULL,
		port INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
		generation INTEGER NOT NULL,
		created_by TEXT NOT NULL DEFAULT '',
		created_at INTEGER NOT NULL,
		updated_at INTEGER NOT NULL
	);
	CREATE TABLE service_bindings (
		service TEXT NOT NULL REFERENCES services (name) ON DELETE CASCADE,
		consumer TEXT NOT NULL,
		port INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
		created_by TEXT NOT NULL DEFAULT '',
		created_at INTEGER NOT NULL,
		PRIMARY KEY (service, consumer)
	);
	CREATE INDEX service_bindings_consumer ON service_bindings (consumer);
	ALTER TABLE roles ADD COLUMN services TEXT NOT NULL DEFAULT '[]';`

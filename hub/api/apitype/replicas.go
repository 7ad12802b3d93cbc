package apitype

import "time"

// ReplicaList is the body of GET /v1/replicas.
type ReplicaList struct {
	// Self is the ID of the replica that answered ("" if the hub runs
	// alone, without --peer-listen).
	Self     string    `json:"self"`
	Replicas []Replica `json:"replicas"`
}

// Replica is one hub replica as the shared store knows it.
type Replica struct {
	ID   string `json:"id"`
	Self bool   `json:"self"`
	// Health is "ok" while the replica's lease runs, "expired" once it
	// stopped heartbeating (dead, or cut off from the store).
	Health     string    `json:"health"`
	PeerAddr   string    `json:"peer_addr"`
	API        string    `json:"api"`
	SSH        string    `json:"ssh"`
	Version    string    `json:"version"`
	Started    time.Time `json:"started"`
	LeaseUntil time.Time `json:"lease_until"`
	// Links are the replicas it has a live peer link to.
	Links []string `json:"links"`
	// Agents are the names of the nodes whose tunnel it holds.
	Agents []string `json:"agents"`
	// Hubs are the addresses agents dial for it (its --advertise, or its
	// listener); join strings name those of every live replica.
	Hubs []string `json:"hubs"`
}

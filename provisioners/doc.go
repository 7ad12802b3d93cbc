// Package provisioners is the home of what the hub does to nodes over SSH,
// through their tunnels and with hub-issued certificates: the runner that
// executes and uploads (runner), the cluster engines (cluster), KubeOne's
// process (kubeone) and the upgrade drive that calls a node's updater
// (upgrade). None of it imports the hub: the hub hands each a dialer and
// the small store-shaped interfaces it needs. What runs from an operator's
// machine, or on the node, lives elsewhere.
package provisioners

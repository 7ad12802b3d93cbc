// Package bulkonboard onboards many machines that are not managed yet, from
// an admin's machine: it reads an inventory, logs in to each machine over
// plain SSH with the admin's own identity (ssh-agent, key files) and
// known_hosts, copies tether-edge to machines that have none, and runs the
// non-interactive `tether-edge onboard --apply` there, a bounded number of
// machines at a time.
//
// It is not the hub's provisioning runner (provisioners/runner): that one
// reaches enrolled nodes through their tunnels and trusts only host
// certificates from the hub's CA. The machines here have no tunnel and no
// certificate yet, so trust comes from the admin's known_hosts, with no
// trust on first use. It lives beside the CLI, whose `tether onboard bulk`
// is its one user: it is neither hub nor agent code, and it runs on the
// operator's machine.
//
// Every remote step is idempotent (the agent copy is checked and renamed
// into place; the onboarding is keyed by machine UUID on the hub and
// refuses a machine onboarded already), so a run can be repeated to finish
// the machines that failed.
package bulkonboard

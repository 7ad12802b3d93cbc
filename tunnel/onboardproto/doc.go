// Package onboardproto is the onboarding contract: the request a machine
// already in the field sends to the hub's onboarding endpoint (Path) with
// an onboarding credential, its facts and a CSR, the hub's answer (a node
// identity and cloud-init user-data), and the one shape of user-data both
// ends accept (UserData). The hub renders and serves it; `tether-edge
// onboard` sends the request and applies the user-data, and the bulk
// onboarder drives that from an operator's machine. Both ends import this
// package; it imports nothing of the hub or the agent.
package onboardproto

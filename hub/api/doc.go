// Package api is the hub's HTTP API, served on the hub's TLS port (ALPN h2
// and http/1.1): the route table (NewHandler) and the core endpoints that
// every hub serves (nodes, tokens, operators, roles, audit, join,
// onboarding, health). Admin endpoints take an admin client
// certificate (mTLS); join and onboarding are authenticated by their
// tokens instead.
//
// The API is in three parts:
//
//   - hub/api/apitype: the wire types, limits and error kinds. It imports
//     nothing of the hub, so clients and features share the contract
//     without the handlers.
//   - hub/api/apiclient: the Go client the CLI, the e2e tests and the
//     benchmarks use.
//   - hub/api/route: how a feature serves its own endpoints.
//
// A feature (jobs, cluster, KubeOne, upgrades, missions, services, ...)
// keeps its handlers in its own package, with a config of the small
// interfaces it uses, and registers them on the route table:
//
//	func (a *API) Register(rt route.Routes) {
//		rt.Handle("GET /v1/things", rt.Admin(a.list))
//		rt.Handle("POST /v1/things", rt.Automation(a.create))
//	}
//
// The hub hands the feature to NewHandler in Deps.Features. Routes wraps
// each endpoint in the authentication it needs (Admin, Automation, Lister)
// and answers failures with the API's one error shape (Routes.Error, with
// route.Fail and the kinds of apitype). A feature imports route and
// apitype, never this package, so this package may import features
// without a cycle. Every pattern a feature registers must be in
// openapi.yaml: TestOpenAPIMatchesRoutes registers every feature and holds
// the document to the routes served.
package api

package service

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/roles"
	"github.com/tether-dev/tether/hub/store"
)

// API serves the service tunnel endpoints (/v1/services) to whoever may
// list nodes; the door decides, node by node, who may expose and connect.
type API struct {
	// Hub is nil on a hub without service tunnels, as is Door: the
	// endpoints answer 404.
	Hub   Hub
	Door  *access.Door
	Store interface {
		GetService(ctx context.Context, name string) (store.Service, error)
		ListServices(ctx context.Context) ([]store.Service, error)
		UpdateService(ctx context.Context, name string,
			f func(cur *store.Service) (*store.Service, error)) (*store.Service, error)
	}
	Audit func(store.AuditEvent)

	rt route.Routes
}

// Hub is the hub's side of the service tunnel endpoints (Tunnels).
type Hub interface {
	// HubID is this hub's ID: the origin of the services created here.
	HubID() string
	// Changed is called after a service was stored or deleted: the hub
	// pushes bindings to its consumers and sends it down the tree.
	Changed(ctx context.Context, sv store.Service, deleted bool)
}

func view(sv store.Service, hubID string) apitype.Service {
	out := apitype.Service{
		Name:       sv.Name,
		Target:     sv.Target,
		Port:       sv.Port,
		Origin:     sv.Origin,
		Local:      sv.Origin == hubID,
		Generation: sv.Generation,
		CreatedBy:  sv.CreatedBy,
		CreatedAt:  sv.CreatedAt,
		UpdatedAt:  sv.UpdatedAt,
		Bindings:   []apitype.ServiceBinding{},
	}
	for _, b := range sv.Bindings {
		out.Bindings = append(
			out.Bindings,
			apitype.ServiceBinding{
				Consumer:  b.Consumer,
				LocalPort: b.Port,
				CreatedBy: b.CreatedBy,
				CreatedAt: b.CreatedAt,
			},
		)
	}
	return out
}

// Register implements route.Feature.
func (a *API) Register(rt route.Routes) {
	a.rt = rt
	rt.Handle("POST /v1/services", rt.Lister(a.expose))
	rt.Handle("GET /v1/services", rt.Lister(a.list))
	rt.Handle("DELETE /v1/services/{name}", rt.Lister(a.delete))
	rt.Handle("POST /v1/services/{name}/bindings", rt.Lister(a.connect))
	rt.Handle("DELETE /v1/services/{name}/bindings/{consumer}", rt.Lister(a.disconnect))
}

func (a *API) audit(e store.AuditEvent) {
	if a.Audit != nil {
		a.Audit(e)
	}
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	return route.Decode(w, r, v, route.MaxBody)
}

// node resolves a node named in a service request and asks the door
// whether c may use perm on it.
func (a *API) node(ctx context.Context, c route.Caller, perm, name string) (store.Node, error) {
	n, _, err := a.Door.Resolve(ctx, access.ByName(name))
	switch {
	case errors.Is(err, access.ErrUnknownNode), errors.Is(err, access.ErrRevoked):
		return store.Node{}, route.Fail(apitype.ErrNotFound, "%s", err.Error())
	case err != nil && !errors.Is(err, access.ErrOffline):
		return store.Node{}, route.Internal("look up node "+strconv.Quote(name), err)
	}
	if err := a.Door.AuthorizeService(c.Caller, perm, n); err != nil {
		return store.Node{}, route.Fail(apitype.ErrRefused, "%s", err.Error())
	}
	return n, nil
}

func (a *API) off(w http.ResponseWriter, r *http.Request) bool {
	if a.Hub == nil || a.Door == nil {
		a.rt.Error(w, r, route.Fail(apitype.ErrNotFound, "service tunnels are not served by this hub"))
		return true
	}
	return false
}

func (a *API) expose(w http.ResponseWriter, r *http.Request, c route.Caller) {
	var req apitype.ServiceExposeRequest
	if !decode(w, r, &req) || a.off(w, r) {
		return
	}
	now := time.Now().UTC()
	sv := store.Service{Name: req.Name, Origin: a.Hub.HubID(), Target: req.Target, Port: req.Port, Generation: 1,
		CreatedBy: c.Name, CreatedAt: now, UpdatedAt: now}
	if err := Validate(sv); err != nil {
		a.rt.Error(w, r, route.Fail(apitype.ErrInvalid, "%s", err.Error()))
		return
	}
	if _, err := a.node(r.Context(), c, roles.ServiceExpose, req.Target); err != nil {
		a.audit(
			store.AuditEvent{
				Kind:   "service_expose",
				Node:   req.Target,
				Remote: r.RemoteAddr,
				Result: "refused",
				Detail: c.Name + ": " + err.Error(),
			},
		)
		a.rt.Error(w, r, err)
		return
	}
	_, err := a.Store.UpdateService(r.Context(), sv.Name, func(cur *store.Service) (*store.Service, error) {
		if cur != nil {
			return nil, route.Fail(
				apitype.ErrConflict,
				"a service named %q exists (to %s:%d); delete it first or choose another name",
				sv.Name,
				cur.Target,
				cur.Port,
			)
		}
		return &sv, nil
	})
	if err != nil {
		a.rt.Error(w, r, apiErr("expose service", err))
		return
	}
	a.audit(store.AuditEvent{Kind: "service_expose", Node: sv.Target, Remote: r.RemoteAddr, Result: "ok",
		Detail: fmt.Sprintf("%s: service %s → %s:%d", c.Name, sv.Name, sv.Target, sv.Port)})
	a.Hub.Changed(r.Context(), sv, false)
	route.JSON(w, http.StatusCreated, view(sv, a.Hub.HubID()))
}

// apiErr keeps a failure's message and hides anything else's.
func apiErr(step string, err error) error {
	if _, ok := route.Message(err); ok {
		return err
	}
	return route.Internal(step, err)
}

// localService refuses a change to a service that came from a hub above:
// its origin owns it.
func localService(cur *store.Service, name, hubID string) error {
	if cur == nil {
		return route.Fail(apitype.ErrNotFound, "no service named %q (see `tether service list`)", name)
	}
	if cur.Origin != hubID {
		return route.Fail(
			apitype.ErrConflict,
			"service %q was created at a hub above this one (origin %.16s…); change it there",
			name,
			cur.Origin,
		)
	}
	return nil
}

func (a *API) connect(w http.ResponseWriter, r *http.Request, c route.Caller) {
	var req apitype.ServiceConnectRequest
	if !decode(w, r, &req) || a.off(w, r) {
		return
	}
	name, hubID := r.PathValue("name"), a.Hub.HubID()
	now := time.Now().UTC()
	b := store.ServiceBinding{Consumer: req.Consumer, Port: req.LocalPort, CreatedBy: c.Name, CreatedAt: now}
	if err := ValidateBinding(b); err != nil {
		a.rt.Error(w, r, route.Fail(apitype.ErrInvalid, "%s", err.Error()))
		return
	}
	ev := store.AuditEvent{Kind: "service_connect_add", Node: req.Consumer, Remote: r.RemoteAddr}
	cur, err := a.Store.GetService(r.Context(), name)
	if err == nil {
		// Connecting makes the consumer reach the target: both need the
		// permission (see access.Door.AuthorizeService).
		for _, node := range []string{req.Consumer, cur.Target} {
			if _, err = a.node(r.Context(), c, roles.ServiceConnect, node); err != nil {
				break
			}
		}
	} else if errors.Is(err, store.ErrNotFound) {
		err = route.Fail(apitype.ErrNotFound, "no service named %q (see `tether service list`)", name)
	}
	if err != nil {
		ev.Result, ev.Detail = "refused", fmt.Sprintf("%s: service %s: %s", c.Name, name, err.Error())
		a.audit(ev)
		a.rt.Error(w, r, apiErr("connect service", err))
		return
	}
	all, err := a.Store.ListServices(r.Context())
	if err != nil {
		a.rt.Error(w, r, route.Internal("list services", err))
		return
	}
	for _, o := range all {
		for _, ob := range o.Bindings {
			if o.Name != name && ob.Consumer == req.Consumer && ob.Port == req.LocalPort {
				a.rt.Error(
					w,
					r,
					route.Fail(
						apitype.ErrConflict,
						"node %s already listens on local port %d for service %s; choose another --local-port",
						req.Consumer,
						req.LocalPort,
						o.Name,
					),
				)
				return
			}
		}
	}
	sv, err := a.Store.UpdateService(r.Context(), name, func(cur *store.Service) (*store.Service, error) {
		if err := localService(cur, name, hubID); err != nil {
			return nil, err
		}
		next := *cur
		next.Bindings = slices.DeleteFunc(
			slices.Clone(cur.Bindings),
			func(x store.ServiceBinding) bool { return x.Consumer == b.Consumer },
		)
		next.Bindings = append(next.Bindings, b)
		next.Generation++
		next.UpdatedAt = now
		if err := Validate(next); err != nil {
			return nil, route.Fail(apitype.ErrInvalid, "%s", err.Error())
		}
		return &next, nil
	})
	if err != nil {
		a.rt.Error(w, r, apiErr("connect service", err))
		return
	}
	ev.Result, ev.Detail = "ok", fmt.Sprintf(
		"%s: %s listens on 127.0.0.1:%d for service %s → %s:%d",
		c.Name,
		b.Consumer,
		b.Port,
		name,
		sv.Target,
		sv.Port,
	)
	a.audit(ev)
	a.Hub.Changed(r.Context(), *sv, false)
	route.JSON(w, http.StatusOK, view(*sv, hubID))
}

func (a *API) disconnect(w http.ResponseWriter, r *http.Request, c route.Caller) {
	if a.off(w, r) {
		return
	}
	name, consumer, hubID := r.PathValue("name"), r.PathValue("consumer"), a.Hub.HubID()
	if _, err := a.node(r.Context(), c, roles.ServiceConnect, consumer); err != nil {
		a.audit(
			store.AuditEvent{
				Kind:   "service_connect_remove",
				Node:   consumer,
				Remote: r.RemoteAddr,
				Result: "refused",
				Detail: c.Name + ": " + err.Error(),
			},
		)
		a.rt.Error(w, r, err)
		return
	}
	sv, err := a.Store.UpdateService(r.Context(), name, func(cur *store.Service) (*store.Service, error) {
		if err := localService(cur, name, hubID); err != nil {
			return nil, err
		}
		next := *cur
		next.Bindings = slices.DeleteFunc(
			slices.Clone(cur.Bindings),
			func(x store.ServiceBinding) bool { return x.Consumer == consumer },
		)
		if len(next.Bindings) == len(cur.Bindings) {
			return nil, route.Fail(apitype.ErrNotFound, "node %s is not a consumer of service %s", consumer, name)
		}
		next.Generation++
		next.UpdatedAt = time.Now().UTC()
		return &next, nil
	})
	if err != nil {
		a.rt.Error(w, r, apiErr("disconnect service", err))
		return
	}
	a.audit(
		store.AuditEvent{
			Kind:   "service_connect_remove",
			Node:   consumer,
			Remote: r.RemoteAddr,
			Result: "ok",
			Detail: c.Name + ": service " + name,
		},
	)
	a.Hub.Changed(r.Context(), *sv, false)
	route.JSON(w, http.StatusOK, view(*sv, hubID))
}

func (a *API) delete(w http.ResponseWriter, r *http.Request, c route.Caller) {
	if a.off(w, r) {
		return
	}
	name, hubID := r.PathValue("name"), a.Hub.HubID()
	cur, err := a.Store.GetService(r.Context(), name)
	if errors.Is(err, store.ErrNotFound) {
		a.rt.Error(w, r, route.Fail(apitype.ErrNotFound, "no service named %q (see `tether service list`)", name))
		return
	}
	if err != nil {
		a.rt.Error(w, r, route.Internal("look up service", err))
		return
	}
	if _, err := a.node(r.Context(), c, roles.ServiceExpose, cur.Target); err != nil {
		a.audit(
			store.AuditEvent{
				Kind:   "service_delete",
				Node:   cur.Target,
				Remote: r.RemoteAddr,
				Result: "refused",
				Detail: c.Name + ": " + err.Error(),
			},
		)
		a.rt.Error(w, r, err)
		return
	}
	var gone store.Service
	if _, err := a.Store.UpdateService(r.Context(), name, func(cur *store.Service) (*store.Service, error) {
		if err := localService(cur, name, hubID); err != nil {
			return nil, err
		}
		gone = *cur
		gone.Generation++
		return nil, nil
	}); err != nil {
		a.rt.Error(w, r, apiErr("delete service", err))
		return
	}
	a.audit(
		store.AuditEvent{
			Kind:   "service_delete",
			Node:   gone.Target,
			Remote: r.RemoteAddr,
			Result: "ok",
			Detail: c.Name + ": service " + name,
		},
	)
	a.Hub.Changed(r.Context(), gone, true)
	route.JSON(w, http.StatusOK, view(gone, hubID))
}

// list shows the admin every service; anyone else the services
// whose target, or one of whose consumers, they may see.
func (a *API) list(w http.ResponseWriter, r *http.Request, c route.Caller) {
	if a.off(w, r) {
		return
	}
	all, err := a.Store.ListServices(r.Context())
	if err != nil {
		a.rt.Error(w, r, route.Internal("list services", err))
		return
	}
	hubID := a.Hub.HubID()
	out := []apitype.Service{}
	for _, sv := range all {
		if c.Admin || a.sees(r.Context(), c, sv.Target) ||
			slices.ContainsFunc(sv.Bindings, func(b store.ServiceBinding) bool {
				return a.sees(r.Context(), c, b.Consumer)
			}) {
			out = append(out, view(sv, hubID))
		}
	}
	route.JSON(w, http.StatusOK, out)
}

func (a *API) sees(ctx context.Context, c route.Caller, name string) bool {
	n, _, err := a.Door.Resolve(ctx, access.ByName(name))
	if err != nil && !errors.Is(err, access.ErrOffline) {
		return false
	}
	return c.Sees(n)
}

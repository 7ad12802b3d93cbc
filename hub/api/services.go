package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/roles"
	"github.com/tether-dev/tether/hub/service"
	"github.com/tether-dev/tether/hub/store"
)

// Services is the hub's side of the service tunnel endpoints.
type Services interface {
	// HubID is this hub's ID: the origin of the services created here.
	HubID() string
	// Changed is called after a service was stored or deleted: the hub
	// pushes bindings to its consumers and sends it down the tree.
	Changed(ctx context.Context, sv store.Service, deleted bool)
}

// Service is a service tunnel as the API shows it.
type Service struct {
	Name string `json:"name"`
	// Target is the node whose Port the service reaches, as this hub names
	// it when the service was created here, as its origin hub names it
	// otherwise (Origin says which).
	Target     string           `json:"target"`
	Port       uint16           `json:"port"`
	Origin     string           `json:"origin"`
	Local      bool             `json:"local"` // created at this hub
	Generation int64            `json:"generation"`
	Bindings   []ServiceBinding `json:"bindings"`
	CreatedBy  string           `json:"created_by,omitempty"`
	CreatedAt  time.Time        `json:"created_at"`
	UpdatedAt  time.Time        `json:"updated_at"`
}

// ServiceBinding is one consumer of a service.
type ServiceBinding struct {
	Consumer  string    `json:"consumer"`
	LocalPort uint16    `json:"local_port"`
	CreatedBy string    `json:"created_by,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// ServiceExposeRequest is the body of POST /v1/services.
type ServiceExposeRequest struct {
	Name   string `json:"name"`
	Target string `json:"target"`
	Port   uint16 `json:"port"`
}

// ServiceConnectRequest is the body of POST /v1/services/{name}/bindings.
type ServiceConnectRequest struct {
	Consumer  string `json:"consumer"`
	LocalPort uint16 `json:"local_port"`
}

func serviceFrom(sv store.Service, hubID string) Service {
	out := Service{Name: sv.Name, Target: sv.Target, Port: sv.Port, Origin: sv.Origin, Local: sv.Origin == hubID, Generation: sv.Generation,
		CreatedBy: sv.CreatedBy, CreatedAt: sv.CreatedAt, UpdatedAt: sv.UpdatedAt, Bindings: []ServiceBinding{}}
	for _, b := range sv.Bindings {
		out.Bindings = append(out.Bindings, ServiceBinding{Consumer: b.Consumer, LocalPort: b.Port, CreatedBy: b.CreatedBy, CreatedAt: b.CreatedAt})
	}
	return out
}

func (h *handler) serviceRoutes(mux *routeMux) {
	mux.HandleFunc("POST /v1/services", h.lister(h.exposeService))
	mux.HandleFunc("GET /v1/services", h.lister(h.listServices))
	mux.HandleFunc("DELETE /v1/services/{name}", h.lister(h.deleteService))
	mux.HandleFunc("POST /v1/services/{name}/bindings", h.lister(h.connectService))
	mux.HandleFunc("DELETE /v1/services/{name}/bindings/{consumer}", h.lister(h.disconnectService))
}

// serviceNode resolves a node named in a service request and asks the door
// whether c may use perm on it.
func (h *handler) serviceNode(ctx context.Context, c caller, perm, name string) (store.Node, error) {
	n, _, err := h.Door.Resolve(ctx, access.ByName(name))
	switch {
	case errors.Is(err, access.ErrUnknownNode), errors.Is(err, access.ErrRevoked):
		return store.Node{}, fail(ErrNotFound, "%s", err.Error())
	case err != nil && !errors.Is(err, access.ErrOffline):
		return store.Node{}, internal("look up node "+strconv.Quote(name), err)
	}
	if err := h.Door.AuthorizeService(c.Caller, perm, n); err != nil {
		return store.Node{}, fail(ErrRefused, "%s", err.Error())
	}
	return n, nil
}

func (h *handler) servicesOff(w http.ResponseWriter, r *http.Request) bool {
	if h.Services == nil || h.Door == nil {
		h.writeErr(w, r, fail(ErrNotFound, "service tunnels are not served by this hub"))
		return true
	}
	return false
}

func (h *handler) exposeService(w http.ResponseWriter, r *http.Request, c caller) {
	var req ServiceExposeRequest
	if !decode(w, r, &req) || h.servicesOff(w, r) {
		return
	}
	now := time.Now().UTC()
	sv := store.Service{Name: req.Name, Origin: h.Services.HubID(), Target: req.Target, Port: req.Port, Generation: 1,
		CreatedBy: c.Name, CreatedAt: now, UpdatedAt: now}
	if err := service.Validate(sv); err != nil {
		h.writeErr(w, r, fail(ErrInvalid, "%s", err.Error()))
		return
	}
	if _, err := h.serviceNode(r.Context(), c, roles.ServiceExpose, req.Target); err != nil {
		h.audit(store.AuditEvent{Kind: "service_expose", Node: req.Target, Remote: r.RemoteAddr, Result: "refused", Detail: c.Name + ": " + err.Error()})
		h.writeErr(w, r, err)
		return
	}
	_, err := h.Store.UpdateService(r.Context(), sv.Name, func(cur *store.Service) (*store.Service, error) {
		if cur != nil {
			return nil, fail(ErrConflict, "a service named %q exists (to %s:%d); delete it first or choose another name", sv.Name, cur.Target, cur.Port)
		}
		return &sv, nil
	})
	if err != nil {
		h.writeErr(w, r, serviceErr("expose service", err))
		return
	}
	h.audit(store.AuditEvent{Kind: "service_expose", Node: sv.Target, Remote: r.RemoteAddr, Result: "ok",
		Detail: fmt.Sprintf("%s: service %s → %s:%d", c.Name, sv.Name, sv.Target, sv.Port)})
	h.Services.Changed(r.Context(), sv, false)
	writeJSON(w, http.StatusCreated, serviceFrom(sv, h.Services.HubID()))
}

// serviceErr keeps a failure's message and hides anything else's.
func serviceErr(step string, err error) error {
	var f *failure
	if errors.As(err, &f) {
		return err
	}
	return internal(step, err)
}

// localService refuses a change to a service that came from a hub above:
// its origin owns it.
func localService(cur *store.Service, name, hubID string) error {
	if cur == nil {
		return fail(ErrNotFound, "no service named %q (see `tether service list`)", name)
	}
	if cur.Origin != hubID {
		return fail(ErrConflict, "service %q was created at a hub above this one (origin %.16s…); change it there", name, cur.Origin)
	}
	return nil
}

func (h *handler) connectService(w http.ResponseWriter, r *http.Request, c caller) {
	var req ServiceConnectRequest
	if !decode(w, r, &req) || h.servicesOff(w, r) {
		return
	}
	name, hubID := r.PathValue("name"), h.Services.HubID()
	now := time.Now().UTC()
	b := store.ServiceBinding{Consumer: req.Consumer, Port: req.LocalPort, CreatedBy: c.Name, CreatedAt: now}
	if err := service.ValidateBinding(b); err != nil {
		h.writeErr(w, r, fail(ErrInvalid, "%s", err.Error()))
		return
	}
	ev := store.AuditEvent{Kind: "service_connect_add", Node: req.Consumer, Remote: r.RemoteAddr}
	cur, err := h.Store.GetService(r.Context(), name)
	if err == nil {
		// Connecting makes the consumer reach the target: both need the
		// permission (see access.Door.AuthorizeService).
		for _, node := range []string{req.Consumer, cur.Target} {
			if _, err = h.serviceNode(r.Context(), c, roles.ServiceConnect, node); err != nil {
				break
			}
		}
	} else if errors.Is(err, store.ErrNotFound) {
		err = fail(ErrNotFound, "no service named %q (see `tether service list`)", name)
	}
	if err != nil {
		ev.Result, ev.Detail = "refused", fmt.Sprintf("%s: service %s: %s", c.Name, name, err.Error())
		h.audit(ev)
		h.writeErr(w, r, serviceErr("connect service", err))
		return
	}
	all, err := h.Store.ListServices(r.Context())
	if err != nil {
		h.writeErr(w, r, internal("list services", err))
		return
	}
	for _, o := range all {
		for _, ob := range o.Bindings {
			if o.Name != name && ob.Consumer == req.Consumer && ob.Port == req.LocalPort {
				h.writeErr(w, r, fail(ErrConflict, "node %s already listens on local port %d for service %s; choose another --local-port", req.Consumer, req.LocalPort, o.Name))
				return
			}
		}
	}
	sv, err := h.Store.UpdateService(r.Context(), name, func(cur *store.Service) (*store.Service, error) {
		if err := localService(cur, name, hubID); err != nil {
			return nil, err
		}
		next := *cur
		next.Bindings = slices.DeleteFunc(slices.Clone(cur.Bindings), func(x store.ServiceBinding) bool { return x.Consumer == b.Consumer })
		next.Bindings = append(next.Bindings, b)
		next.Generation++
		next.UpdatedAt = now
		if err := service.Validate(next); err != nil {
			return nil, fail(ErrInvalid, "%s", err.Error())
		}
		return &next, nil
	})
	if err != nil {
		h.writeErr(w, r, serviceErr("connect service", err))
		return
	}
	ev.Result, ev.Detail = "ok", fmt.Sprintf("%s: %s listens on 127.0.0.1:%d for service %s → %s:%d", c.Name, b.Consumer, b.Port, name, sv.Target, sv.Port)
	h.audit(ev)
	h.Services.Changed(r.Context(), *sv, false)
	writeJSON(w, http.StatusOK, serviceFrom(*sv, hubID))
}

func (h *handler) disconnectService(w http.ResponseWriter, r *http.Request, c caller) {
	if h.servicesOff(w, r) {
		return
	}
	name, consumer, hubID := r.PathValue("name"), r.PathValue("consumer"), h.Services.HubID()
	if _, err := h.serviceNode(r.Context(), c, roles.ServiceConnect, consumer); err != nil {
		h.audit(store.AuditEvent{Kind: "service_connect_remove", Node: consumer, Remote: r.RemoteAddr, Result: "refused", Detail: c.Name + ": " + err.Error()})
		h.writeErr(w, r, err)
		return
	}
	sv, err := h.Store.UpdateService(r.Context(), name, func(cur *store.Service) (*store.Service, error) {
		if err := localService(cur, name, hubID); err != nil {
			return nil, err
		}
		next := *cur
		next.Bindings = slices.DeleteFunc(slices.Clone(cur.Bindings), func(x store.ServiceBinding) bool { return x.Consumer == consumer })
		if len(next.Bindings) == len(cur.Bindings) {
			return nil, fail(ErrNotFound, "node %s is not a consumer of service %s", consumer, name)
		}
		next.Generation++
		next.UpdatedAt = time.Now().UTC()
		return &next, nil
	})
	if err != nil {
		h.writeErr(w, r, serviceErr("disconnect service", err))
		return
	}
	h.audit(store.AuditEvent{Kind: "service_connect_remove", Node: consumer, Remote: r.RemoteAddr, Result: "ok", Detail: c.Name + ": service " + name})
	h.Services.Changed(r.Context(), *sv, false)
	writeJSON(w, http.StatusOK, serviceFrom(*sv, hubID))
}

func (h *handler) deleteService(w http.ResponseWriter, r *http.Request, c caller) {
	if h.servicesOff(w, r) {
		return
	}
	name, hubID := r.PathValue("name"), h.Services.HubID()
	cur, err := h.Store.GetService(r.Context(), name)
	if errors.Is(err, store.ErrNotFound) {
		h.writeErr(w, r, fail(ErrNotFound, "no service named %q (see `tether service list`)", name))
		return
	}
	if err != nil {
		h.writeErr(w, r, internal("look up service", err))
		return
	}
	if _, err := h.serviceNode(r.Context(), c, roles.ServiceExpose, cur.Target); err != nil {
		h.audit(store.AuditEvent{Kind: "service_delete", Node: cur.Target, Remote: r.RemoteAddr, Result: "refused", Detail: c.Name + ": " + err.Error()})
		h.writeErr(w, r, err)
		return
	}
	var gone store.Service
	if _, err := h.Store.UpdateService(r.Context(), name, func(cur *store.Service) (*store.Service, error) {
		if err := localService(cur, name, hubID); err != nil {
			return nil, err
		}
		gone = *cur
		gone.Generation++
		return nil, nil
	}); err != nil {
		h.writeErr(w, r, serviceErr("delete service", err))
		return
	}
	h.audit(store.AuditEvent{Kind: "service_delete", Node: gone.Target, Remote: r.RemoteAddr, Result: "ok", Detail: c.Name + ": service " + name})
	h.Services.Changed(r.Context(), gone, true)
	writeJSON(w, http.StatusOK, serviceFrom(gone, hubID))
}

// listServices shows the admin every service; anyone else the services
// whose target, or one of whose consumers, they may see.
func (h *handler) listServices(w http.ResponseWriter, r *http.Request, c caller) {
	if h.servicesOff(w, r) {
		return
	}
	all, err := h.Store.ListServices(r.Context())
	if err != nil {
		h.writeErr(w, r, internal("list services", err))
		return
	}
	hubID := h.Services.HubID()
	out := []Service{}
	for _, sv := range all {
		if c.Admin || h.seesNode(r.Context(), c, sv.Target) || slices.ContainsFunc(sv.Bindings, func(b store.ServiceBinding) bool {
			return h.seesNode(r.Context(), c, b.Consumer)
		}) {
			out = append(out, serviceFrom(sv, hubID))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *handler) seesNode(ctx context.Context, c caller, name string) bool {
	n, _, err := h.Door.Resolve(ctx, access.ByName(name))
	if err != nil && !errors.Is(err, access.ErrOffline) {
		return false
	}
	return c.sees(n)
}

// ExposeService publishes target:port under name (POST /v1/services).
func (c *Client) ExposeService(ctx context.Context, req ServiceExposeRequest) (Service, error) {
	var out Service
	return out, c.do(ctx, http.MethodPost, "/v1/services", req, &out)
}

// ConnectService makes consumer listen on 127.0.0.1:localPort for service
// name.
func (c *Client) ConnectService(ctx context.Context, name string, req ServiceConnectRequest) (Service, error) {
	var out Service
	return out, c.do(ctx, http.MethodPost, "/v1/services/"+url.PathEscape(name)+"/bindings", req, &out)
}

// DisconnectService removes consumer's binding of service name.
func (c *Client) DisconnectService(ctx context.Context, name, consumer string) (Service, error) {
	var out Service
	return out, c.do(ctx, http.MethodDelete, "/v1/services/"+url.PathEscape(name)+"/bindings/"+url.PathEscape(consumer), nil, &out)
}

// DeleteService removes service name and all its bindings.
func (c *Client) DeleteService(ctx context.Context, name string) (Service, error) {
	var out Service
	return out, c.do(ctx, http.MethodDelete, "/v1/services/"+url.PathEscape(name), nil, &out)
}

// ListServices returns the services the caller may see.
func (c *Client) ListServices(ctx context.Context) ([]Service, error) {
	var out []Service
	return out, c.do(ctx, http.MethodGet, "/v1/services", nil, &out)
}

package apiclient

import (
	"context"
	"net/http"
	"net/url"

	"github.com/tether-dev/tether/hub/api/apitype"
)

// ExposeService publishes target:port under name (POST /v1/services).
func (c *Client) ExposeService(ctx context.Context, req apitype.ServiceExposeRequest) (apitype.Service, error) {
	var out apitype.Service
	return out, c.do(ctx, http.MethodPost, "/v1/services", req, &out)
}

// ConnectService makes consumer listen on 127.0.0.1:localPort for service
// name.
func (c *Client) ConnectService(
	ctx context.Context,
	name string,
	req apitype.ServiceConnectRequest,
) (apitype.Service, error) {
	var out apitype.Service
	return out, c.do(ctx, http.MethodPost, "/v1/services/"+url.PathEscape(name)+"/bindings", req, &out)
}

// DisconnectService removes consumer's binding of service name.
func (c *Client) DisconnectService(ctx context.Context, name, consumer string) (apitype.Service, error) {
	var out apitype.Service
	return out, c.do(
		ctx,
		http.MethodDelete,
		"/v1/services/"+url.PathEscape(name)+"/bindings/"+url.PathEscape(consumer),
		nil,
		&out,
	)
}

// DeleteService removes service name and all its bindings.
func (c *Client) DeleteService(ctx context.Context, name string) (apitype.Service, error) {
	var out apitype.Service
	return out, c.do(ctx, http.MethodDelete, "/v1/services/"+url.PathEscape(name), nil, &out)
}

// ListServices returns the services the caller may see.
func (c *Client) ListServices(ctx context.Context) ([]apitype.Service, error) {
	var out []apitype.Service
	return out, c.do(ctx, http.MethodGet, "/v1/services", nil, &out)
}

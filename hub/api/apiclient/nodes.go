package apiclient

import (
	"context"
	"net/http"
	"net/url"

	"github.com/tether-dev/tether/hub/api/apitype"
)

// ListNodesMatching lists the nodes the client may see whose hub-set labels
// match selector ("" for all).
func (c *Client) ListNodesMatching(ctx context.Context, selector string) ([]apitype.Node, error) {
	path := "/v1/nodes"
	if selector != "" {
		path += "?selector=" + url.QueryEscape(selector)
	}
	var out []apitype.Node
	err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out, err
}

// LabelNodes changes the hub-set labels of nodes (admin only).
func (c *Client) LabelNodes(ctx context.Context, req apitype.NodeLabelRequest) ([]apitype.Node, error) {
	var out []apitype.Node
	err := c.do(ctx, http.MethodPost, "/v1/nodes/labels", req, &out)
	return out, err
}

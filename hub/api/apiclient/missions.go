package apiclient

import (
	"context"
	"net/http"
	"net/url"

	"github.com/tether-dev/tether/hub/api/apitype"
)

// CreateMission creates a mission at the hub, or its next generation when
// the spec changed.
func (c *Client) CreateMission(ctx context.Context, req apitype.MissionCreateRequest) (apitype.MissionDetail, error) {
	var out apitype.MissionDetail
	return out, c.do(ctx, http.MethodPost, "/v1/missions", req, &out)
}

// ListMissions lists the missions the hub holds (created there or
// received from a hub above).
func (c *Client) ListMissions(ctx context.Context) ([]apitype.Mission, error) {
	var out []apitype.Mission
	return out, c.do(ctx, http.MethodGet, "/v1/missions", nil, &out)
}

// GetMission returns a mission with its state per site and per node;
// origin "" takes the one created at the hub (else the only one so named).
func (c *Client) GetMission(ctx context.Context, name, origin string) (apitype.MissionDetail, error) {
	var out apitype.MissionDetail
	p := "/v1/missions/" + url.PathEscape(name)
	if origin != "" {
		p += "?origin=" + url.QueryEscape(origin)
	}
	return out, c.do(ctx, http.MethodGet, p, nil, &out)
}

// DeleteMission writes the tombstone of a mission created at the hub.
func (c *Client) DeleteMission(ctx context.Context, name string) (apitype.DesiredObject, error) {
	var out apitype.DesiredObject
	return out, c.do(ctx, http.MethodDelete, "/v1/missions/"+url.PathEscape(name), nil, &out)
}

package apiclient

import (
	"context"
	"net/http"
	"net/url"

	"github.com/tether-dev/tether/hub/api/apitype"
)

// CreateUpgrade pins the artifact and starts the rollout.
func (c *Client) CreateUpgrade(ctx context.Context, req apitype.UpgradeCreateRequest) (apitype.UpgradeDetail, error) {
	var out apitype.UpgradeDetail
	return out, c.do(ctx, http.MethodPost, "/v1/upgrades", req, &out)
}

// ListUpgrades lists the upgrades, newest first.
func (c *Client) ListUpgrades(ctx context.Context) ([]apitype.Upgrade, error) {
	var out []apitype.Upgrade
	return out, c.do(ctx, http.MethodGet, "/v1/upgrades", nil, &out)
}

// GetUpgrade returns an upgrade and its nodes.
func (c *Client) GetUpgrade(ctx context.Context, name string) (apitype.UpgradeDetail, error) {
	var out apitype.UpgradeDetail
	return out, c.do(ctx, http.MethodGet, "/v1/upgrades/"+url.PathEscape(name), nil, &out)
}

// UpgradeAction pauses, resumes or cancels a rollout (verb: pause,
// resume, cancel).
func (c *Client) UpgradeAction(ctx context.Context, name, verb string) (apitype.Upgrade, error) {
	var out apitype.Upgrade
	return out, c.do(ctx, http.MethodPost, "/v1/upgrades/"+url.PathEscape(name)+"/"+url.PathEscape(verb), nil, &out)
}

// ConfirmUpgrade confirms the upgrade waiting on node.
func (c *Client) ConfirmUpgrade(ctx context.Context, name, node string) (apitype.UpgradeNode, error) {
	var out apitype.UpgradeNode
	return out, c.do(
		ctx,
		http.MethodPost,
		"/v1/upgrades/"+url.PathEscape(name)+"/confirm",
		apitype.UpgradeConfirmRequest{Node: node},
		&out,
	)
}

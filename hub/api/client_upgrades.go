package api

import (
	"context"
	"net/http"
	"net/url"
)

// CreateUpgrade pins the artifact and starts the rollout.
func (c *Client) CreateUpgrade(ctx context.Context, req UpgradeCreateRequest) (UpgradeDetail, error) {
	var out UpgradeDetail
	return out, c.do(ctx, http.MethodPost, "/v1/upgrades", req, &out)
}

// ListUpgrades lists the upgrades, newest first.
func (c *Client) ListUpgrades(ctx context.Context) ([]Upgrade, error) {
	var out []Upgrade
	return out, c.do(ctx, http.MethodGet, "/v1/upgrades", nil, &out)
}

// GetUpgrade returns an upgrade and its nodes.
func (c *Client) GetUpgrade(ctx context.Context, name string) (UpgradeDetail, error) {
	var out UpgradeDetail
	return out, c.do(ctx, http.MethodGet, "/v1/upgrades/"+url.PathEscape(name), nil, &out)
}

// UpgradeAction pauses, resumes or cancels a rollout (verb: pause,
// resume, cancel).
func (c *Client) UpgradeAction(ctx context.Context, name, verb string) (Upgrade, error) {
	var out Upgrade
	return out, c.do(ctx, http.MethodPost, "/v1/upgrades/"+url.PathEscape(name)+"/"+url.PathEscape(verb), nil, &out)
}

// ConfirmUpgrade confirms the upgrade waiting on node.
func (c *Client) ConfirmUpgrade(ctx context.Context, name, node string) (UpgradeNode, error) {
	var out UpgradeNode
	return out, c.do(ctx, http.MethodPost, "/v1/upgrades/"+url.PathEscape(name)+"/confirm", UpgradeConfirmRequest{Node: node}, &out)
}

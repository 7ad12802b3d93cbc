package apiclient

import (
	"context"
	"net/http"
	"net/url"

	"github.com/tether-dev/tether/hub/api/apitype"
)

// CreateOnboarding creates an onboarding credential.
func (c *Client) CreateOnboarding(
	ctx context.Context,
	req apitype.OnboardingCreateRequest,
) (apitype.OnboardingCreateResponse, error) {
	var out apitype.OnboardingCreateResponse
	return out, c.do(ctx, http.MethodPost, "/v1/onboarding", req, &out)
}

// ListOnboarding lists the onboarding credentials.
func (c *Client) ListOnboarding(ctx context.Context) ([]apitype.OnboardingCredential, error) {
	var out []apitype.OnboardingCredential
	return out, c.do(ctx, http.MethodGet, "/v1/onboarding", nil, &out)
}

// RevokeOnboarding revokes the onboarding credential named name.
func (c *Client) RevokeOnboarding(ctx context.Context, name string) (apitype.OnboardingCredential, error) {
	var out apitype.OnboardingCredential
	return out, c.do(ctx, http.MethodPost, "/v1/onboarding/"+url.PathEscape(name)+"/revoke", nil, &out)
}

// AddOSProfile adds an OS profile.
func (c *Client) AddOSProfile(ctx context.Context, req apitype.OSProfileAddRequest) (apitype.OSProfile, error) {
	var out apitype.OSProfile
	return out, c.do(ctx, http.MethodPost, "/v1/osprofiles", req, &out)
}

// ListOSProfiles lists the OS profiles.
func (c *Client) ListOSProfiles(ctx context.Context) ([]apitype.OSProfile, error) {
	var out []apitype.OSProfile
	return out, c.do(ctx, http.MethodGet, "/v1/osprofiles", nil, &out)
}

// RemoveOSProfile removes the OS profile named name.
func (c *Client) RemoveOSProfile(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/osprofiles/"+url.PathEscape(name), nil, nil)
}

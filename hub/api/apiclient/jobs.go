package apiclient

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/tether-dev/tether/hub/api/apitype"
)

// PutBlob uploads size bytes from r to the hub's blob store; sha256 (hex,
// may be empty) is checked by the hub.
func (c *Client) PutBlob(ctx context.Context, r io.Reader, size int64, sha256 string) (apitype.BlobResponse, error) {
	var out apitype.BlobResponse
	path := "/v1/blobs"
	if sha256 != "" {
		path += "?sha256=" + url.QueryEscape(sha256)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, r)
	if err != nil {
		return out, err
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	c.authorize(req)
	resp, err := c.stream.Do(req)
	if err != nil {
		return out, fmt.Errorf("hub API %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return out, err
	}
	if resp.StatusCode >= 300 {
		return out, apiError(resp, b)
	}
	return out, json.Unmarshal(b, &out)
}

// CreateJob starts a job.
func (c *Client) CreateJob(ctx context.Context, req apitype.JobCreateRequest) (apitype.Job, error) {
	var out apitype.Job
	return out, c.do(ctx, http.MethodPost, "/v1/jobs", req, &out)
}

// ListJobs lists jobs, newest first.
func (c *Client) ListJobs(ctx context.Context, limit int) ([]apitype.Job, error) {
	var out []apitype.Job
	path := "/v1/jobs"
	if limit > 0 {
		path += "?limit=" + strconv.Itoa(limit)
	}
	return out, c.do(ctx, http.MethodGet, path, nil, &out)
}

// GetJob returns a job and its per-node results.
func (c *Client) GetJob(ctx context.Context, id string) (apitype.JobDetail, error) {
	var out apitype.JobDetail
	return out, c.do(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(id), nil, &out)
}

// CancelJob cancels a running job and returns its final record.
func (c *Client) CancelJob(ctx context.Context, id string) (apitype.Job, error) {
	var out apitype.Job
	return out, c.do(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(id)+"/cancel", nil, &out)
}

// RerunJob starts a new job with the same spec on all or the failed nodes.
func (c *Client) RerunJob(ctx context.Context, id string, failed bool) (apitype.Job, error) {
	var out apitype.Job
	return out, c.do(
		ctx,
		http.MethodPost,
		"/v1/jobs/"+url.PathEscape(id)+"/rerun",
		apitype.JobRerunRequest{Failed: failed},
		&out,
	)
}

// NodeLog returns a node's stored log of a job.
func (c *Client) NodeLog(ctx context.Context, id, node string) ([]byte, error) {
	return c.getBytes(ctx, c.stream, "/v1/jobs/"+url.PathEscape(id)+"/nodes/"+url.PathEscape(node)+"/log")
}

// getBytes GETs path and returns its body (at most 4 MiB) as it is, for
// answers that are files rather than JSON.
func (c *Client) getBytes(ctx context.Context, via *http.Client, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return nil, err
	}
	c.authorize(req)
	resp, err := via.Do(req)
	if err != nil {
		return nil, fmt.Errorf("hub API %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		return nil, apiError(resp, b)
	}
	return b, nil
}

// JobEvents follows a job (one node's events if node is not ""), calling
// fn for each event until the job ends, fn returns an error, or ctx ends.
func (c *Client) JobEvents(ctx context.Context, id, node string, fn func(apitype.JobEvent) error) error {
	path := "/v1/jobs/" + url.PathEscape(id) + "/events"
	if node != "" {
		path += "?node=" + url.QueryEscape(node)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return err
	}
	c.authorize(req)
	resp, err := c.stream.Do(req)
	if err != nil {
		return fmt.Errorf("hub API %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return apiError(resp, b)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		var ev apitype.JobEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("job %s events: %w", id, err)
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("job %s events: %w", id, err)
	}
	return ctx.Err()
}

// CreateAPIToken creates an API token for a role.
func (c *Client) CreateAPIToken(
	ctx context.Context,
	req apitype.APITokenCreateRequest,
) (apitype.APITokenCreateResponse, error) {
	var out apitype.APITokenCreateResponse
	return out, c.do(ctx, http.MethodPost, "/v1/apitokens", req, &out)
}

// ListAPITokens lists API tokens (without secrets).
func (c *Client) ListAPITokens(ctx context.Context) ([]apitype.APIToken, error) {
	var out []apitype.APIToken
	return out, c.do(ctx, http.MethodGet, "/v1/apitokens", nil, &out)
}

// DeleteAPIToken revokes an API token.
func (c *Client) DeleteAPIToken(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/apitokens/"+url.PathEscape(id), nil, nil)
}

// ClusterRegister sets a node's desired cluster state to active.
func (c *Client) ClusterRegister(ctx context.Context, node, engine string) (apitype.ClusterMember, error) {
	var out apitype.ClusterMember
	return out, c.do(
		ctx,
		http.MethodPut,
		"/v1/cluster/"+url.PathEscape(node),
		apitype.ClusterRegisterRequest{Engine: engine},
		&out,
	)
}

// ClusterDeregister sets a node's desired cluster state to inactive.
func (c *Client) ClusterDeregister(ctx context.Context, node string) (apitype.ClusterMember, error) {
	var out apitype.ClusterMember
	return out, c.do(ctx, http.MethodDelete, "/v1/cluster/"+url.PathEscape(node), nil, &out)
}

// ClusterStatus lists cluster members.
func (c *Client) ClusterStatus(ctx context.Context) ([]apitype.ClusterMember, error) {
	var out []apitype.ClusterMember
	return out, c.do(ctx, http.MethodGet, "/v1/cluster", nil, &out)
}

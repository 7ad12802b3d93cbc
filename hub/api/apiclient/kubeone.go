package apiclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"

	"github.com/tether-dev/tether/hub/api/apitype"
)

// CreateKubeOne creates a KubeOne cluster.
func (c *Client) CreateKubeOne(ctx context.Context, spec apitype.KubeOneSpec) (apitype.KubeOneCluster, error) {
	var out apitype.KubeOneCluster
	return out, c.do(ctx, http.MethodPost, "/v1/kubeone", spec, &out)
}

// ListKubeOne lists KubeOne clusters.
func (c *Client) ListKubeOne(ctx context.Context) ([]apitype.KubeOneCluster, error) {
	var out []apitype.KubeOneCluster
	return out, c.do(ctx, http.MethodGet, "/v1/kubeone", nil, &out)
}

// GetKubeOne returns one KubeOne cluster.
func (c *Client) GetKubeOne(ctx context.Context, name string) (apitype.KubeOneCluster, error) {
	var out apitype.KubeOneCluster
	return out, c.do(ctx, http.MethodGet, "/v1/kubeone/"+url.PathEscape(name), nil, &out)
}

// DeleteKubeOne deletes a KubeOne cluster.
func (c *Client) DeleteKubeOne(ctx context.Context, name string) (apitype.KubeOneCluster, error) {
	var out apitype.KubeOneCluster
	return out, c.do(ctx, http.MethodDelete, "/v1/kubeone/"+url.PathEscape(name), nil, &out)
}

// SetKubeOneMembers replaces a KubeOne cluster's members.
func (c *Client) SetKubeOneMembers(
	ctx context.Context,
	name string,
	req apitype.KubeOneMembersRequest,
) (apitype.KubeOneCluster, error) {
	var out apitype.KubeOneCluster
	return out, c.do(ctx, http.MethodPut, "/v1/kubeone/"+url.PathEscape(name)+"/members", req, &out)
}

// KubeOneManifest renders a KubeOne cluster's manifest; bastion (HOST or
// HOST:PORT, "" for the hub's own) is how KubeOne reaches the hub.
func (c *Client) KubeOneManifest(ctx context.Context, name, bastion string) (string, error) {
	path := "/v1/kubeone/" + url.PathEscape(name) + "/manifest"
	if bastion != "" {
		path += "?bastion=" + url.QueryEscape(bastion)
	}
	var out apitype.KubeOneManifest
	return out.Manifest, c.do(ctx, http.MethodGet, path, nil, &out)
}

// KubeOneStatus returns a KubeOne cluster's status.
func (c *Client) KubeOneStatus(ctx context.Context, name string) (apitype.KubeOneStatus, error) {
	var out apitype.KubeOneStatus
	return out, c.do(ctx, http.MethodGet, "/v1/kubeone/"+url.PathEscape(name)+"/status", nil, &out)
}

// KubeOneRun starts `kubeone apply` or `reset` (action) for the cluster.
func (c *Client) KubeOneRun(
	ctx context.Context,
	cluster, action string,
	req apitype.KubeOneRunRequest,
) (apitype.Job, error) {
	var j apitype.Job
	err := c.do(ctx, http.MethodPost, "/v1/kubeone/"+url.PathEscape(cluster)+"/"+url.PathEscape(action), req, &j)
	return j, err
}

// KubeOneKubeconfig fetches the cluster's admin kubeconfig as kubeadm
// wrote it.
func (c *Client) KubeOneKubeconfig(ctx context.Context, cluster string) ([]byte, error) {
	return c.getBytes(ctx, c.http, "/v1/kubeone/"+url.PathEscape(cluster)+"/kubeconfig")
}

// KubeOneProxy serves the cluster's kube-apiserver on ln until ctx ends:
// every connection accepted is relayed through the hub. logf reports
// connections that failed.
func (c *Client) KubeOneProxy(
	ctx context.Context,
	cluster string,
	ln net.Listener,
	logf func(format string, args ...any),
) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	done := make(chan struct{})
	live := 0
	defer func() {
		for range live {
			<-done
		}
	}()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		live++
		go func() {
			defer func() { done <- struct{}{} }()
			if err := c.proxyOne(ctx, cluster, conn); err != nil && ctx.Err() == nil {
				logf("connection from %s: %v", conn.RemoteAddr(), err)
			}
		}()
	}
}

func (c *Client) proxyOne(ctx context.Context, cluster string, local net.Conn) error {
	defer local.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(
		ctx,
		http.MethodPost,
		c.base+"/v1/kubeone/"+url.PathEscape(cluster)+"/proxy",
		pr,
	)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	c.authorize(req)
	go func() {
		_, err := io.Copy(pw, local)
		pw.CloseWithError(err)
	}()
	resp, err := c.stream.Do(req)
	if err != nil {
		return fmt.Errorf("hub API %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return apiError(resp, b)
	}
	_, err = io.Copy(local, resp.Body)
	if errors.Is(err, net.ErrClosed) || errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

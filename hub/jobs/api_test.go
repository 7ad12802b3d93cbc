package jobs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/blobs"
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
)

// okConn runs every command with exit status 0.
type okConn struct{}

func (okConn) Run(context.Context, jobs.Command, io.Writer, io.Writer) (int, error) { return 0, nil }
func (okConn) Upload(context.Context, io.Reader, int64, string, os.FileMode, bool) (string, error) {
	return "", errors.New("no uploads here")
}
func (okConn) Exists(context.Context, string) (bool, error) { return false, nil }
func (okConn) Close() error                                 { return nil }

// A rerun targets the nodes the job ran on, by ID: after one of them is
// removed and a new machine joins under its name, the rerun is refused
// rather than run on the newcomer, which no one authorized it for.
func TestRerunNeverTargetsANamesake(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.OpenSQLite(ctx, filepath.Join(dir, "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	blobs, err := blobs.New(filepath.Join(dir, "blobs"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	// resolve finds a node the way the hub's presence check does, whatever
	// the engine hands over (an ID; a name on code that keyed runs by name).
	resolve := func(ref string) (store.Node, error) {
		if n, err := st.GetNode(ctx, ref); err == nil {
			return n, nil
		}
		return st.GetNodeByName(ctx, ref)
	}
	var mu sync.Mutex
	reached := map[string]int{} // node ID -> connections
	eng := jobs.New(
		ctx,
		jobs.Config{Store: st, Blobs: blobs, FlushInterval: 10 * time.Millisecond, PollInterval: 10 * time.Millisecond,
			Online: func(ref string) string {
				if _, err := resolve(ref); err != nil {
					return "removed"
				}
				return ""
			},
			Connect: func(_ context.Context, ref string) (jobs.Conn, error) {
				n, err := resolve(ref)
				if err != nil {
					return nil, err
				}
				mu.Lock()
				reached[n.ID]++
				mu.Unlock()
				return okConn{}, nil
			},
		},
	)
	defer eng.Close()
	door, err := access.New(
		ctx,
		access.Config{Store: st, Conns: nodeconn.NewTable(), UserCAs: func() []gossh.PublicKey { return nil }},
	)
	if err != nil {
		t.Fatal(err)
	}
	jobsAPI := &jobs.API{Engine: eng, Blobs: blobs, Store: st, Targets: api.Targets{Store: st}}
	srv := httptest.NewServer(api.NewHandler(api.Deps{Store: st, Door: door, Metrics: metrics.New(), Jobs: eng,
		Features: []route.Feature{jobsAPI}}))
	defer srv.Close()

	join := func(id, name string) {
		t.Helper()
		tok := store.Token{ID: "t-" + id, SecretHash: []byte("h"), UsesLeft: 1, ExpiresAt: time.Now().Add(time.Hour)}
		if err := st.CreateToken(ctx, tok); err != nil {
			t.Fatal(err)
		}
		ok := func(store.Token) error { return nil }
		if _, err := st.Join(ctx, "t-"+id, ok, store.Node{ID: id, Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	tokID, secret, err := pki.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	apiTok := store.APIToken{ID: tokID, SecretHash: pki.HashSecret(secret), Role: "all", CreatedAt: time.Now()}
	if err := st.CreateAPIToken(ctx, apiTok); err != nil {
		t.Fatal(err)
	}
	call := func(method, path string, body any, out any) int {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequestWithContext(ctx, method, srv.URL+path, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+apitype.APITokenPrefix+tokID+"."+secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if e, ok := out.(*string); ok {
			*e = string(raw)
		} else if out != nil && resp.StatusCode < 300 {
			if err := json.Unmarshal(raw, out); err != nil {
				t.Fatalf("%s %s: %v in %s", method, path, err, raw)
			}
		}
		return resp.StatusCode
	}

	join("id-old", "edge")
	join("id-other", "edge-2")
	var j apitype.Job
	create := apitype.JobCreateRequest{Command: "true", Nodes: []string{"edge", "edge-2"}}
	if code := call("POST", "/v1/jobs", create, &j); code != http.StatusCreated {
		t.Fatalf("create job: %d", code)
	}
	if done, err := eng.Wait(ctx, j.ID); err != nil || done.State != store.JobSucceeded {
		t.Fatalf("job = %+v, %v", done, err)
	}
	var d apitype.JobDetail
	if code := call("GET", "/v1/jobs/"+j.ID, nil, &d); code != http.StatusOK || len(d.Nodes) != 2 ||
		d.Nodes[0].NodeID != "id-old" {
		t.Fatalf("job detail %d: %+v", code, d)
	}

	// The node is removed; a new machine joins under its name.
	if err := st.DeleteNode(ctx, "id-old"); err != nil {
		t.Fatal(err)
	}
	join("id-new", "edge")

	var msg string
	code := call("POST", "/v1/jobs/"+j.ID+"/rerun", apitype.JobRerunRequest{}, &msg)
	if code == http.StatusCreated {
		var re apitype.Job
		_ = json.Unmarshal([]byte(msg), &re)
		_, _ = eng.Wait(ctx, re.ID)
	}
	mu.Lock()
	defer mu.Unlock()
	if reached["id-new"] > 0 {
		t.Fatalf("a rerun of a job on the removed node ran on the new machine that took its name (%d, %s)", code, msg)
	}
	if code != http.StatusBadRequest || !strings.Contains(msg, "edge") || !strings.Contains(msg, "removed") {
		t.Fatalf("rerun: %d %s, want 400 naming the removed node", code, msg)
	}
}

package control

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
)

func frame(body string) []byte {
	b := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(b, uint32(len(body)))
	copy(b[4:], body)
	return b
}

func TestRoundTrip(t *testing.T) {
	msgs := []*Message{
		{
			Type: TypeHello,
			Hello: &Hello{
				ProtocolVersion: ProtocolVersion,
				Name:            "n1",
				AgentVersion:    "v0",
				Facts:           Facts{Hostname: "h", OS: "Debian", Arch: "amd64"},
				Capabilities:    []string{"ssh-embedded"},
				ResumeInstance:  "0123456789abcdef0123456789abcdef",
			},
		},
		{Type: TypeWelcome, Welcome: &Welcome{NodeID: "id", Name: "n1", HeartbeatSeconds: 30}},
		{Type: TypeWelcome, Welcome: &Welcome{NodeID: "id", Name: "n1", HeartbeatSeconds: 20, DeadPeerSeconds: 60}},
		{Type: TypeHeartbeat},
		{Type: TypeAuthorizedKeys, AuthorizedKeys: []string{"ssh-ed25519 AAAA"}},
		{Type: TypeNotice, Notice: "bye"},
		{
			Type: TypeSSHTrust,
			SSHTrust: &SSHTrust{
				HostCert:     "ssh-ed25519-cert-v01@openssh.com AAAA",
				UserCAs:      []string{"ssh-ed25519 AAAA"},
				NoForwarding: []string{"tether:ops:root"},
			},
		},
		{Type: TypeWelcome, Welcome: &Welcome{NodeID: "id", Name: "n1", Capabilities: []string{HubCapSSHEvents}}},
		{Type: TypeWelcome, Welcome: &Welcome{NodeID: "id", Name: "n1", Hubs: []string{"a:7443", "b:7443"}}},
		{
			Type: TypeSSHEvent,
			SSHEvent: &SSHEvent{
				Kind:           "login-refused",
				Login:          "root",
				Operator:       "alice",
				KeyFingerprint: "SHA256:x",
				Detail:         "not allowed",
			},
		},
		{
			Type: TypeSSHTrust,
			SSHTrust: &SSHTrust{
				UserCAs: []string{"ssh-ed25519 AAAA"},
				ScopedUserCAs: []ScopedUserCA{
					{Keys: []string{"ssh-ed25519 BBBB"}, Principals: map[string][]string{"root": {"tether:ops:root"}}},
				},
			},
		},
	}
	var buf bytes.Buffer
	for _, m := range msgs {
		if err := Write(&buf, m); err != nil {
			t.Fatalf("write %s: %v", m.Type, err)
		}
	}
	for _, want := range msgs {
		got, err := Read(&buf)
		if err != nil {
			t.Fatalf("read %s: %v", want.Type, err)
		}
		if got.Type != want.Type {
			t.Fatalf("got %s want %s", got.Type, want.Type)
		}
	}
	if _, err := Read(&buf); err != io.EOF {
		t.Fatalf("at end: %v, want io.EOF", err)
	}
}

func TestReadRejects(t *testing.T) {
	huge := make([]byte, 4)
	binary.BigEndian.PutUint32(huge, MaxFrame+1)
	cases := map[string][]byte{
		"zero length":      {0, 0, 0, 0},
		"oversized":        huge,
		"truncated length": {0, 0},
		"truncated body":   frame(`{"type":"heartbeat"}`)[:10],
		"not json":         frame(`hello`),
		"unknown type":     frame(`{"type":"exec","notice":"rm -rf /"}`),
		"hello no body":    frame(`{"type":"hello"}`),
		"hello old proto":  frame(`{"type":"hello","hello":{"protocol_version":99,"name":"n"}}`),
		"long name": frame(
			`{"type":"hello","hello":{"protocol_version":1,"name":"` + strings.Repeat("a", 300) + `"}}`,
		),
		"resume instance short": frame(
			`{"type":"hello","hello":{"protocol_version":1,"name":"n","resume_instance":"abc"}}`,
		),
		"resume instance upper": frame(`{"type":"hello","hello":{"protocol_version":1,"name":"n",` +
			`"resume_instance":"` + strings.Repeat("A", 32) + `"}}`),
		"welcome no id":              frame(`{"type":"welcome","welcome":{}}`),
		"welcome dead peer negative": frame(`{"type":"welcome","welcome":{"node_id":"id","dead_peer_seconds":-1}}`),
		"welcome dead peer a year": frame(
			`{"type":"welcome","welcome":{"node_id":"id","dead_peer_seconds":31536000}}`,
		),
		"welcome heartbeat overflow": frame(
			`{"type":"welcome","welcome":{"node_id":"id","heartbeat_seconds":9300000000}}`,
		),
		"welcome too many hubs": frame(
			`{"type":"welcome","welcome":{"node_id":"id","hubs":["a:1"` + strings.Repeat(`,"a:1"`, MaxWelcomeHubs) + `]}}`,
		),
		"welcome long hub": frame(
			`{"type":"welcome","welcome":{"node_id":"id","hubs":["` + strings.Repeat("h", 300) + `:1"]}}`,
		),
		"ssh_trust no body": frame(`{"type":"ssh_trust"}`),
		"ssh_event no body": frame(`{"type":"ssh_event"}`),
		"ssh_event no kind": frame(`{"type":"ssh_event","ssh_event":{"login":"root"}}`),
		"scoped CA no keys": frame(
			`{"type":"ssh_trust","ssh_trust":{"scoped_user_cas":[{"principals":{"root":["p"]}}]}}`,
		),
		"ssh_event long": frame(
			`{"type":"ssh_event","ssh_event":{"kind":"forward","detail":"` + strings.Repeat("d", 2000) + `"}}`,
		),
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Read(bytes.NewReader(in))
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("Read = %v, want ErrBadMessage", err)
			}
		})
	}
}

// endedReader ends with err after its bytes, as a tunnel stream whose
// session ended does (tunnel.ErrSessionClosed wrapping
// io.ErrUnexpectedEOF).
type endedReader struct {
	r   *bytes.Reader
	err error
}

func (e *endedReader) Read(b []byte) (int, error) {
	if e.r.Len() == 0 {
		return 0, e.err
	}
	return e.r.Read(b)
}

// TestReadSessionEnded: a stream that ends between frames with an error of
// its own gets that error back, not a malformed frame (an agent reported
// "truncated length" whenever its TCP hub stopped cleanly); an end inside
// the length prefix is still one.
func TestReadSessionEnded(t *testing.T) {
	ended := fmt.Errorf("tunnel: stream: session closed: %w", io.ErrUnexpectedEOF)
	r := &endedReader{r: bytes.NewReader(frame(`{"type":"heartbeat"}`)), err: ended}
	if m, err := Read(r); err != nil || m.Type != TypeHeartbeat {
		t.Fatalf("first frame: %v, %v", m, err)
	}
	if _, err := Read(r); err != ended {
		t.Fatalf("between frames: %v, want the stream's own error %v", err, ended)
	}
	r = &endedReader{r: bytes.NewReader([]byte{0, 0}), err: ended}
	if _, err := Read(r); !errors.Is(err, ErrBadMessage) || !errors.Is(err, ended) {
		t.Fatalf("inside the length prefix: %v, want ErrBadMessage wrapping the stream's error", err)
	}
}

// FuzzRead: no input panics or allocates past MaxFrame, and whatever decodes
// re-encodes and decodes again to the same type.
func FuzzRead(f *testing.F) {
	f.Add(frame(`{"type":"heartbeat"}`))
	f.Add(frame(`{"type":"hello","hello":{"protocol_version":1,"name":"n1","facts":{"arch":"amd64"}}}`))
	f.Add(frame(`{"type":"authorized_keys","authorized_keys":["ssh-ed25519 AAAA"]}`))
	// A refused login as the embedded server reports it.
	f.Add(frame(`{"type":"ssh_event","ssh_event":` +
		`{"kind":"login-refused","login":"root","operator":"alice","key_fingerprint":"SHA256:x"}}`))
	// A welcome from a hub that takes ssh events.
	f.Add(frame(`{"type":"welcome","welcome":{"node_id":"id","heartbeat_seconds":30,"capabilities":["ssh-events"]}}`))
	// A welcome that names the hub's dead-peer timeout.
	f.Add(frame(`{"type":"welcome","welcome":` +
		`{"node_id":"id","heartbeat_seconds":20,"dead_peer_seconds":60,"capabilities":["transport-liveness"]}}`))
	// Trust with an ancestor hub's user CA scoped to one principal.
	f.Add(
		frame(
			`{"type":"ssh_trust","ssh_trust":{"user_cas":[],"scoped_user_cas":[{"keys":["ssh-ed25519 AAAA"],` +
				`"principals":{"root":["tether:ops:root"]}}]}}`,
		),
	)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 2, '{', '}'})
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := Read(bytes.NewReader(in))
		if err != nil {
			return
		}
		var buf bytes.Buffer
		if err := Write(&buf, m); err != nil {
			t.Fatalf("decoded message does not re-encode: %v", err)
		}
		m2, err := Read(&buf)
		if err != nil || m2.Type != m.Type {
			t.Fatalf("re-decode: %v", err)
		}
	})
}

func FuzzJoinRequestValidate(f *testing.F) {
	f.Add("abcdefgh.secret", "n1", []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, token, name string, csr []byte) {
		r := JoinRequest{Token: token, Name: name, CSR: csr}
		_ = r.Validate()
	})
}

// TestHeartbeatFastPath: WriteHeartbeat sends the very bytes Write does for a
// heartbeat, and Read's shortcut for them yields what the JSON codec would.
func TestHeartbeatFastPath(t *testing.T) {
	var slow, fast bytes.Buffer
	if err := Write(&slow, &Message{Type: TypeHeartbeat}); err != nil {
		t.Fatal(err)
	}
	if err := WriteHeartbeat(&fast); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(slow.Bytes(), fast.Bytes()) {
		t.Fatalf("WriteHeartbeat wrote %q, Write %q", fast.Bytes(), slow.Bytes())
	}
	for _, in := range [][]byte{fast.Bytes(), frame(`{ "type": "heartbeat" }`)} {
		m, err := Read(bytes.NewReader(in))
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		var want Message
		if err := json.Unmarshal(in[4:], &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(*m, want) {
			t.Errorf("%q: Read = %+v, the JSON codec %+v", in, *m, want)
		}
	}
}

func BenchmarkHeartbeatRoundTrip(b *testing.B) {
	var buf bytes.Buffer
	for b.Loop() {
		buf.Reset()
		if err := WriteHeartbeat(&buf); err != nil {
			b.Fatal(err)
		}
		if _, err := Read(&buf); err != nil {
			b.Fatal(err)
		}
	}
}

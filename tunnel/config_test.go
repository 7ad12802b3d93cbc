package tunnel

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestParseTransport(t *testing.T) {
	tests := []struct {
		in      string
		want    Transport
		wantErr bool
	}{
		{"auto", TransportAuto, false},
		{"quic", TransportQUIC, false},
		{"tcp", TransportTCP, false},
		{"", 0, true},
		{"udp", 0, true},
		{"QUIC", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseTransport(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseTransport(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err != nil &&
			(!strings.HasPrefix(err.Error(), "tunnel: ") || !strings.Contains(err.Error(), "auto, quic or tcp")) {
			t.Errorf("ParseTransport(%q) error %q should list the valid values", tt.in, err)
		}
		if err == nil && got.String() != tt.in {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), tt.in)
		}
	}
	if s := Transport(7).String(); s != "transport(7)" {
		t.Errorf("unknown transport prints %q", s)
	}
}

func TestTransportText(t *testing.T) {
	var v struct{ T Transport }
	if err := json.Unmarshal([]byte(`{"T":"tcp"}`), &v); err != nil || v.T != TransportTCP {
		t.Fatalf("unmarshal: %v, %v", v.T, err)
	}
	b, err := json.Marshal(v)
	if err != nil || string(b) != `{"T":"tcp"}` {
		t.Fatalf("marshal: %s, %v", b, err)
	}
	if err := json.Unmarshal([]byte(`{"T":"sctp"}`), &v); err == nil {
		t.Fatal("unmarshal of unknown transport succeeded")
	}
	if _, err := json.Marshal(struct{ T Transport }{Transport(9)}); err == nil {
		t.Fatal("marshal of unknown transport succeeded")
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  *Config
		want string // substring of the error; "" means valid
	}{
		{"nil", nil, ""},
		{"zero", &Config{}, ""},
		{"defaults", DefaultConfig(), ""},
		{"fast", &Config{KeepAliveInterval: 500 * time.Millisecond, IdleTimeout: 2 * time.Second}, ""},
		{"negative keepalive", &Config{KeepAliveInterval: -1}, "KeepAliveInterval"},
		{"idle below keepalive", &Config{KeepAliveInterval: 10 * time.Second, IdleTimeout: 5 * time.Second}, "IdleTimeout"},
		{"idle equals keepalive", &Config{KeepAliveInterval: 5 * time.Second, IdleTimeout: 5 * time.Second}, "IdleTimeout"},
		{"negative handshake", &Config{HandshakeTimeout: -time.Second}, "HandshakeTimeout"},
		{"tiny stream window", &Config{StreamWindow: 1024}, "StreamWindow"},
		{"huge stream window", &Config{StreamWindow: 2 << 30}, "StreamWindow"},
		{"session below stream window", &Config{StreamWindow: 8 << 20, SessionWindow: 4 << 20}, "SessionWindow"},
		{"negative streams", &Config{MaxStreams: -3}, "MaxStreams"},
		{"too many streams", &Config{MaxStreams: 1 << 20}, "MaxStreams"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tt.want != "" &&
				(err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "tunnel: ")):
				t.Fatalf("Validate = %v, want an error about %s", err, tt.want)
			}
		})
	}
}

func TestConfigMapping(t *testing.T) {
	c, err := (&Config{MaxStreams: 10}).resolve()
	if err != nil {
		t.Fatal(err)
	}
	if c.KeepAliveInterval != DefaultKeepAliveInterval || c.StreamWindow != DefaultStreamWindow || c.MaxStreams != 10 {
		t.Fatalf("resolve did not fill defaults: %+v", c)
	}
	q := c.quicConfig()
	if q.MaxIdleTimeout != c.IdleTimeout || q.KeepAlivePeriod != c.keepAliveAfter() ||
		q.MaxStreamReceiveWindow != uint64(c.StreamWindow) || q.MaxConnectionReceiveWindow != c.SessionWindow ||
		q.MaxIncomingStreams != 10 || q.HandshakeIdleTimeout*2 != c.HandshakeTimeout {
		t.Errorf("quic config %+v does not match %+v", q, c)
	}
	y := c.yamuxConfig(orDiscard(nil))
	if y.KeepAliveInterval != c.KeepAliveInterval || y.ConnectionWriteTimeout != c.keepAliveWait() ||
		y.MaxStreamWindowSize != c.StreamWindow || y.AcceptBacklog != 10 || y.EnableKeepAlive {
		t.Errorf("yamux config %+v does not match %+v", y, c)
	}
}

package tunnel

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	tests := []struct {
		h    Header
		wire []byte
		str  string
	}{
		{Header{Service: ServiceSSH}, []byte{1, 0, 3, 1, 0, 0}, "ssh"},
		{Header{Service: ServiceTCP, Port: 1}, []byte{1, 0, 3, 2, 0, 1}, "tcp:1"},
		{Header{Service: ServiceTCP, Port: 8080}, []byte{1, 0, 3, 2, 0x1f, 0x90}, "tcp:8080"},
		{Header{Service: ServiceTCP, Port: 65535}, []byte{1, 0, 3, 2, 0xff, 0xff}, "tcp:65535"},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		if err := WriteHeader(&buf, tt.h); err != nil {
			t.Fatalf("WriteHeader(%v): %v", tt.h, err)
		}
		if !bytes.Equal(buf.Bytes(), tt.wire) {
			t.Errorf("WriteHeader(%v) = %v, want %v", tt.h, buf.Bytes(), tt.wire)
		}
		// Payload after the header must stay unread.
		buf.WriteString("payload")
		got, err := ReadHeader(&buf)
		if err != nil || got != tt.h {
			t.Errorf("ReadHeader = %v, %v; want %v", got, err, tt.h)
		}
		if buf.String() != "payload" {
			t.Errorf("ReadHeader consumed payload: %q left", buf.String())
		}
		if tt.h.String() != tt.str {
			t.Errorf("String() = %q, want %q", tt.h.String(), tt.str)
		}
	}
	if s := Service(9).String(); s != "service(9)" {
		t.Errorf("unknown service prints %q", s)
	}
}

func TestReadHeaderErrors(t *testing.T) {
	tests := []struct {
		name  string
		wire  []byte
		want  string
		isEOF bool
	}{
		{"empty", nil, "truncated", true},
		{"truncated prefix", []byte{1, 0}, "truncated", true},
		{"truncated body", []byte{1, 0, 3, 2, 0}, "truncated", true},
		{"unknown version", []byte{2, 0, 3, 1, 0, 0}, "unsupported version 2", false},
		{"version 0", []byte{0, 0, 0}, "unsupported version 0", false},
		{"oversize length", []byte{1, 0xff, 0xff}, "exceeds", false},
		{"length just over max", []byte{1, 0, 65}, "exceeds", false},
		{"short v1 body", []byte{1, 0, 2, 1, 0}, "body length 2", false},
		{"long v1 body", []byte{1, 0, 4, 1, 0, 0, 0}, "body length 4", false},
		{"unknown service", []byte{1, 0, 3, 9, 0, 0}, "unknown service 9", false},
		{"route with a port", []byte{1, 0, 3, 3, 0, 22}, "port 22 given for route", false},
		{"service 0", []byte{1, 0, 3, 0, 0, 0}, "unknown service 0", false},
		{"tcp without port", []byte{1, 0, 3, 2, 0, 0}, "port 0", false},
		{"ssh with port", []byte{1, 0, 3, 1, 0, 22}, "port 22", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadHeader(bytes.NewReader(tt.wire))
			if !errors.Is(err, ErrBadHeader) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ReadHeader error %v, want ErrBadHeader mentioning %q", err, tt.want)
			}
			isEOF := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
			if isEOF != tt.isEOF {
				t.Errorf("error %v wraps EOF: %v, want %v", err, isEOF, tt.isEOF)
			}
		})
	}
}

// An unknown version is consumed whole, so the agent can still reply.
func TestReadHeaderSkipsUnknownVersion(t *testing.T) {
	r := bytes.NewReader([]byte{7, 0, 5, 1, 2, 3, 4, 5, 'x'})
	if _, err := ReadHeader(r); !errors.Is(err, ErrBadHeader) {
		t.Fatalf("ReadHeader: %v", err)
	}
	if r.Len() != 1 {
		t.Fatalf("%d bytes left after an unknown-version frame, want 1", r.Len())
	}
}

func TestReadHeaderIOError(t *testing.T) {
	boom := errors.New("boom")
	_, err := ReadHeader(io.MultiReader(bytes.NewReader([]byte{1}), errReader{boom}))
	if !errors.Is(err, boom) || errors.Is(err, ErrBadHeader) {
		t.Fatalf("ReadHeader error %v, want the reader's error, not ErrBadHeader", err)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func TestWriteHeaderInvalid(t *testing.T) {
	for _, h := range []Header{{}, {Service: ServiceSSH, Port: 22}, {Service: ServiceTCP}, {Service: 42, Port: 1}} {
		var buf bytes.Buffer
		if err := WriteHeader(&buf, h); !errors.Is(err, ErrBadHeader) {
			t.Errorf("WriteHeader(%+v) = %v, want ErrBadHeader", h, err)
		}
		if buf.Len() != 0 {
			t.Errorf("WriteHeader(%+v) wrote %d bytes of an invalid header", h, buf.Len())
		}
	}
}

func TestReplyRoundTrip(t *testing.T) {
	tests := []struct {
		r    Reply
		wire []byte
	}{
		{Reply{OK: true}, []byte{1, 0, 0, 0}},
		{Reply{}, []byte{1, 1, 0, 0}},
		{Reply{Reason: "port 25 not allowed"}, append([]byte{1, 1, 0, 19}, "port 25 not allowed"...)},
		{Reply{OK: true, Reason: "über"}, append([]byte{1, 0, 0, 5}, "über"...)},
		{Reply{Reason: strings.Repeat("x", MaxReasonLen)}, append([]byte{1, 1, 2, 0}, strings.Repeat("x", MaxReasonLen)...)},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		if err := WriteReply(&buf, tt.r); err != nil {
			t.Fatalf("WriteReply(%+v): %v", tt.r, err)
		}
		if !bytes.Equal(buf.Bytes(), tt.wire) {
			t.Errorf("WriteReply(%+v) = %v, want %v", tt.r, buf.Bytes(), tt.wire)
		}
		buf.WriteString("payload")
		got, err := ReadReply(&buf)
		if err != nil || got != tt.r {
			t.Errorf("ReadReply = %+v, %v; want %+v", got, err, tt.r)
		}
		if buf.String() != "payload" {
			t.Errorf("ReadReply consumed payload: %q left", buf.String())
		}
	}
}

func TestReadReplyErrors(t *testing.T) {
	tests := []struct {
		name string
		wire []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"truncated prefix", []byte{1, 0, 0}, "truncated"},
		{"truncated reason", []byte{1, 1, 0, 5, 'a', 'b'}, "truncated"},
		{"unknown version", []byte{2, 0, 0, 0}, "unsupported version 2"},
		{"unknown status", []byte{1, 2, 0, 0}, "unknown status 2"},
		{"oversize reason", []byte{1, 1, 2, 1}, "exceeds"},
		{"invalid UTF-8", []byte{1, 1, 0, 2, 0xc3, 0x28}, "UTF-8"},
		{"escape sequence", []byte{1, 1, 0, 4, 0x1b, '[', '2', 'J'}, "control character"},
		{"newline", []byte{1, 1, 0, 3, 'a', '\n', 'b'}, "control character"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadReply(bytes.NewReader(tt.wire))
			if !errors.Is(err, ErrBadHeader) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ReadReply error %v, want ErrBadHeader mentioning %q", err, tt.want)
			}
		})
	}
}

func TestWriteReplyInvalid(t *testing.T) {
	for _, r := range []Reply{
		{Reason: strings.Repeat("x", MaxReasonLen+1)},
		{Reason: "bad\xff"},
		{Reason: "line\nbreak"},
		{Reason: "\x1b]0;pwned\x07"},
	} {
		var buf bytes.Buffer
		if err := WriteReply(&buf, r); !errors.Is(err, ErrBadHeader) {
			t.Errorf("WriteReply(%q) = %v, want ErrBadHeader", r.Reason, err)
		}
		if buf.Len() != 0 {
			t.Errorf("WriteReply(%q) wrote %d bytes", r.Reason, buf.Len())
		}
	}
}

// FuzzReadHeader: ReadHeader never panics, fails only with ErrBadHeader on
// in-memory input, and whatever it accepts re-encodes to exactly the bytes
// it consumed.
func FuzzReadHeader(f *testing.F) {
	f.Add([]byte{1, 0, 3, 1, 0, 0})            // ssh
	f.Add([]byte{1, 0, 3, 2, 0x1f, 0x90})      // tcp:8080
	f.Add([]byte{1, 0, 3, 2, 0, 0})            // tcp without port
	f.Add([]byte{1, 0, 3, 1, 0, 22})           // ssh with port
	f.Add([]byte{2, 0, 3, 1, 0, 0})            // future version
	f.Add([]byte{1, 0xff, 0xff})               // oversize length
	f.Add([]byte{1, 0, 64})                    // max length, truncated body
	f.Add([]byte{1, 0, 4, 2, 0, 80, 0})        // v1 with an extra byte
	f.Add([]byte{1, 0, 3, 2, 0, 80, 'G', 'E'}) // header followed by payload
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		h, err := ReadHeader(r)
		if err != nil {
			if !errors.Is(err, ErrBadHeader) {
				t.Fatalf("error %v does not wrap ErrBadHeader", err)
			}
			return
		}
		consumed := data[:len(data)-r.Len()]
		var buf bytes.Buffer
		if err := WriteHeader(&buf, h); err != nil {
			t.Fatalf("decoded %+v does not re-encode: %v", h, err)
		}
		if !bytes.Equal(buf.Bytes(), consumed) {
			t.Fatalf("decoded %x as %+v, which encodes as %x", consumed, h, buf.Bytes())
		}
	})
}

// FuzzReadReply: as FuzzReadHeader, for replies.
func FuzzReadReply(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0})                               // ok
	f.Add([]byte{1, 1, 0, 6, 'd', 'e', 'n', 'i', 'e', 'd'}) // refused with reason
	f.Add([]byte{1, 1, 0, 2, 0xc3, 0xbc})                   // UTF-8 reason
	f.Add([]byte{1, 1, 0, 1, 0x1b})                         // control character
	f.Add([]byte{1, 1, 0, 2, 0xc3, 0x28})                   // invalid UTF-8
	f.Add([]byte{1, 3, 0, 0})                               // unknown status
	f.Add([]byte{1, 1, 2, 1})                               // reason too long
	f.Add([]byte{9, 0, 0, 0})                               // future version
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		rep, err := ReadReply(r)
		if err != nil {
			if !errors.Is(err, ErrBadHeader) {
				t.Fatalf("error %v does not wrap ErrBadHeader", err)
			}
			return
		}
		consumed := data[:len(data)-r.Len()]
		var buf bytes.Buffer
		if err := WriteReply(&buf, rep); err != nil {
			t.Fatalf("decoded %+v does not re-encode: %v", rep, err)
		}
		if !bytes.Equal(buf.Bytes(), consumed) {
			t.Fatalf("decoded %x as %+v, which encodes as %x", consumed, rep, buf.Bytes())
		}
	})
}

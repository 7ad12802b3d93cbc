package resume

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func mkID(b byte) ID {
	var id ID
	for i := range id {
		id[i] = b + byte(i)
	}
	return id
}

func TestFrameRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		f    frame
		wire []byte
	}{
		{"data", frame{typ: frameData, data: []byte("hi")}, []byte{1, 0, 0, 0, 2, 'h', 'i'}},
		{"max data", frame{typ: frameData, data: bytes.Repeat([]byte{7}, MaxFrame)},
			append([]byte{1, 0, 1, 0, 0}, bytes.Repeat([]byte{7}, MaxFrame)...)},
		{"ack", frame{typ: frameAck, ack: 0x0102030405060708}, []byte{2, 1, 2, 3, 4, 5, 6, 7, 8}},
		{"ack 0", frame{typ: frameAck}, []byte{2, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"fin", frame{typ: frameFin}, []byte{3}},
		{"close", frame{typ: frameClose, reason: "node revoked"}, append([]byte{4, 0, 12}, "node revoked"...)},
		{"close no reason", frame{typ: frameClose}, []byte{4, 0, 0}},
		{"close max reason", frame{typ: frameClose, reason: strings.Repeat("ü", MaxReasonLen/2)},
			append([]byte{4, 2, 0}, strings.Repeat("ü", MaxReasonLen/2)...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wire := appendFrame(nil, tt.f)
			if !bytes.Equal(wire, tt.wire) {
				t.Fatalf("appendFrame = %x, want %x", wire, tt.wire)
			}
			r := bytes.NewReader(append(wire, 0xee)) // what follows stays unread
			got, err := readFrame(r, func(n int) []byte { return make([]byte, n) })
			if err != nil {
				t.Fatalf("readFrame: %v", err)
			}
			if got.typ != tt.f.typ || !bytes.Equal(got.data, tt.f.data) || got.ack != tt.f.ack ||
				got.reason != tt.f.reason {
				t.Fatalf("readFrame = %+v, want %+v", got, tt.f)
			}
			if r.Len() != 1 {
				t.Fatalf("readFrame left %d bytes, want 1", r.Len())
			}
		})
	}
}

func TestReadFrameErrors(t *testing.T) {
	tests := []struct {
		name string
		wire []byte
		want error  // errors.Is
		text string // in the message
	}{
		{"nothing", nil, io.EOF, ""},
		{"unknown type", []byte{9}, ErrProtocol, "unknown frame type 9"},
		{"type 0", []byte{0, 0, 0}, ErrProtocol, "unknown frame type 0"},
		{"empty data", []byte{1, 0, 0, 0, 0}, ErrProtocol, "0 bytes"},
		{"oversize data", []byte{1, 0, 1, 0, 1}, ErrProtocol, "65537 bytes"},
		{"huge data", []byte{1, 0xff, 0xff, 0xff, 0xff}, ErrProtocol, "want 1..65536"},
		{"oversize reason", []byte{4, 2, 1}, ErrProtocol, "513 bytes"},
		{"reason with escape", []byte{4, 0, 3, 0x1b, '[', 'J'}, ErrProtocol, "control character"},
		{"reason with newline", []byte{4, 0, 1, '\n'}, ErrProtocol, "control character"},
		{"reason not UTF-8", []byte{4, 0, 2, 0xc3, 0x28}, ErrProtocol, "UTF-8"},
		{"truncated data header", []byte{1, 0, 0}, io.ErrUnexpectedEOF, ""},
		{"truncated data", []byte{1, 0, 0, 0, 3, 'a'}, io.ErrUnexpectedEOF, ""},
		{"truncated ack", []byte{2, 0, 0, 0}, io.ErrUnexpectedEOF, ""},
		{"truncated close", []byte{4, 0, 5, 'a'}, io.ErrUnexpectedEOF, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := readFrame(bytes.NewReader(tt.wire), func(n int) []byte { return make([]byte, n) })
			if !errors.Is(err, tt.want) || !strings.Contains(fmtErr(err), tt.text) {
				t.Fatalf("readFrame error %v, want %v mentioning %q", err, tt.want, tt.text)
			}
			// A link cut mid-frame is a detach, never a protocol error.
			if tt.want != ErrProtocol && errors.Is(err, ErrProtocol) {
				t.Fatalf("readFrame error %v wraps ErrProtocol", err)
			}
		})
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestReadFrameIOError(t *testing.T) {
	boom := errors.New("boom")
	_, err := readFrame(io.MultiReader(bytes.NewReader([]byte{2, 0}), errReader{boom}), nil)
	if !errors.Is(err, boom) || errors.Is(err, ErrProtocol) {
		t.Fatalf("readFrame error %v, want the reader's error", err)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func TestOpenRoundTrip(t *testing.T) {
	id := mkID(1)
	var buf bytes.Buffer
	if err := WriteOpen(&buf, id); err != nil {
		t.Fatal(err)
	}
	want := append([]byte{1}, id[:]...)
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("WriteOpen = %x, want %x", buf.Bytes(), want)
	}
	buf.WriteString("frames")
	got, err := ReadOpen(&buf)
	if err != nil || got != id {
		t.Fatalf("ReadOpen = %v, %v; want %v", got, err, id)
	}
	if buf.String() != "frames" {
		t.Fatalf("ReadOpen consumed what follows: %q left", buf.String())
	}
	if err := WriteOpen(&buf, ID{}); !errors.Is(err, ErrProtocol) {
		t.Fatalf("WriteOpen(zero id) = %v, want ErrProtocol", err)
	}
}

func TestReadOpenErrors(t *testing.T) {
	id := mkID(1)
	tests := []struct {
		name  string
		wire  []byte
		text  string
		isEOF bool
	}{
		{"empty", nil, "truncated", true},
		{"truncated", append([]byte{1}, id[:5]...), "truncated", true},
		{"version 2", append([]byte{2}, id[:]...), "unsupported version 2", false},
		{"version 0", append([]byte{0}, id[:]...), "unsupported version 0", false},
		{"zero id", make([]byte, openLen), "", false},
		{"zero id v1", append([]byte{1}, make([]byte, 16)...), "all zeros", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadOpen(bytes.NewReader(tt.wire))
			if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("ReadOpen error %v, want ErrProtocol mentioning %q", err, tt.text)
			}
			isEOF := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
			if isEOF != tt.isEOF {
				t.Errorf("error %v wraps EOF: %v, want %v", err, isEOF, tt.isEOF)
			}
		})
	}
}

func TestResumeRequestRoundTrip(t *testing.T) {
	req := ResumeRequest{ID: mkID(3), Received: 1<<40 + 5}
	var buf bytes.Buffer
	if err := WriteResumeRequest(&buf, req); err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte{1}, req.ID[:]...), 0, 0, 1, 0, 0, 0, 0, 5)
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("WriteResumeRequest = %x, want %x", buf.Bytes(), want)
	}
	buf.WriteByte(0xee)
	got, err := ReadResumeRequest(&buf)
	if err != nil || got != req {
		t.Fatalf("ReadResumeRequest = %+v, %v; want %+v", got, err, req)
	}
	if buf.Len() != 1 {
		t.Fatalf("ReadResumeRequest left %d bytes, want 1", buf.Len())
	}
	for name, wire := range map[string][]byte{
		"empty":     nil,
		"truncated": append([]byte{1}, req.ID[:]...),
		"version 3": append(append([]byte{3}, req.ID[:]...), make([]byte, 8)...),
		"zero id":   append([]byte{1}, make([]byte, 24)...),
	} {
		if _, err := ReadResumeRequest(bytes.NewReader(wire)); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: ReadResumeRequest error %v, want ErrProtocol", name, err)
		}
	}
	if err := WriteResumeRequest(&buf, ResumeRequest{}); !errors.Is(err, ErrProtocol) {
		t.Errorf("WriteResumeRequest(zero id) = %v, want ErrProtocol", err)
	}
}

func TestResumeAnswerRoundTrip(t *testing.T) {
	tests := []struct {
		a    ResumeAnswer
		wire []byte
	}{
		{ResumeAnswer{OK: true, Received: 258}, []byte{1, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0}},
		{ResumeAnswer{OK: true}, []byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
		{ResumeAnswer{}, []byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
		{ResumeAnswer{Reason: "expired"}, append([]byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7}, "expired"...)},
		{ResumeAnswer{Reason: strings.Repeat("x", MaxReasonLen)},
			append([]byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0}, strings.Repeat("x", MaxReasonLen)...)},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		if err := WriteResumeAnswer(&buf, tt.a); err != nil {
			t.Fatalf("WriteResumeAnswer(%+v): %v", tt.a, err)
		}
		if !bytes.Equal(buf.Bytes(), tt.wire) {
			t.Errorf("WriteResumeAnswer(%+v) = %x, want %x", tt.a, buf.Bytes(), tt.wire)
		}
		buf.WriteString("frames")
		got, err := ReadResumeAnswer(&buf)
		if err != nil || got != tt.a {
			t.Errorf("ReadResumeAnswer = %+v, %v; want %+v", got, err, tt.a)
		}
		if buf.String() != "frames" {
			t.Errorf("ReadResumeAnswer consumed what follows: %q left", buf.String())
		}
	}
}

func TestResumeAnswerErrors(t *testing.T) {
	tests := []struct {
		name string
		wire []byte
		text string
	}{
		{"empty", nil, "truncated"},
		{"truncated prefix", []byte{1, 0, 0}, "truncated"},
		{"truncated reason", []byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 'a'}, "truncated"},
		{"version 2", []byte{2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, "unsupported version 2"},
		{"unknown status", []byte{1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, "unknown status 2"},
		{"reason too long", []byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 1}, "exceeds"},
		{"ok with reason", []byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 'x'}, "accepted answer with a reason"},
		{"refused with count", []byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0}, "received count 9"},
		{"escape in reason", []byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0x1b, 'c'}, "control character"},
		{"bad UTF-8", []byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff}, "UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadResumeAnswer(bytes.NewReader(tt.wire))
			if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("ReadResumeAnswer error %v, want ErrProtocol mentioning %q", err, tt.text)
			}
		})
	}
	for _, a := range []ResumeAnswer{
		{OK: true, Reason: "why"},
		{Received: 3},
		{Reason: strings.Repeat("x", MaxReasonLen+1)},
		{Reason: "a\x07b"},
		{Reason: "\xff"},
	} {
		var buf bytes.Buffer
		if err := WriteResumeAnswer(&buf, a); !errors.Is(err, ErrProtocol) || buf.Len() != 0 {
			t.Errorf("WriteResumeAnswer(%+v) = %v after %d bytes, want ErrProtocol before any", a, err, buf.Len())
		}
	}
}

func TestID(t *testing.T) {
	a, b := NewID(), NewID()
	if a == b || a == (ID{}) {
		t.Fatalf("NewID gave %v and %v", a, b)
	}
	s := mkID(0xa0).String()
	if s != "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf" {
		t.Fatalf("String() = %q", s)
	}
	got, err := ParseID(s)
	if err != nil || got != mkID(0xa0) {
		t.Fatalf("ParseID(%q) = %v, %v", s, got, err)
	}
	for _, bad := range []string{"", "a0", s + "00", "zz" + s[2:]} {
		if _, err := ParseID(bad); err == nil {
			t.Errorf("ParseID(%q) succeeded", bad)
		}
	}
}

func TestSanitizeReason(t *testing.T) {
	tests := map[string]string{
		"fine":                            "fine",
		"two\nlines":                      "two?lines",
		"\x1b[2Jclear":                    "?[2Jclear",
		"bad \xff byte":                   "bad ? byte",
		strings.Repeat("é", MaxReasonLen): strings.Repeat("é", MaxReasonLen/2),
	}
	for in, want := range tests {
		got := sanitizeReason(in)
		if got != want {
			t.Errorf("sanitizeReason(%.20q) = %.20q, want %.20q", in, got, want)
		}
		if err := validateReason(got); err != nil {
			t.Errorf("sanitizeReason(%.20q) is invalid: %v", in, err)
		}
	}
}

// FuzzFrames: readFrame never panics; on in-memory input it fails only with
// ErrProtocol, or with io.EOF / io.ErrUnexpectedEOF at the end of input;
// and every frame it accepts re-encodes to exactly the bytes it consumed.
func FuzzFrames(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 2, 'h', 'i'})
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, 5, 3})
	f.Add([]byte{3, 3})
	f.Add(append([]byte{4, 0, 6}, "reason"...))
	f.Add([]byte{4, 0, 1, 0x1b})
	f.Add([]byte{1, 0, 0, 0, 0})
	f.Add([]byte{1, 0, 1, 0, 1})
	f.Add([]byte{1, 0, 0, 0, 9, 'a'})
	f.Add([]byte{5})
	f.Add(append(append([]byte{1, 0, 0, 0, 1, 'x'}, 2, 0, 0, 0, 0, 0, 0, 0, 1), 3, 4, 0, 0))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		for {
			before := r.Len()
			fr, err := readFrame(r, func(n int) []byte { return make([]byte, n) })
			if err != nil {
				if !errors.Is(err, ErrProtocol) && err != io.EOF && err != io.ErrUnexpectedEOF {
					t.Fatalf("error %v is neither ErrProtocol nor an end of input", err)
				}
				if err == io.EOF && before != 0 {
					t.Fatalf("io.EOF with %d bytes left", before)
				}
				return
			}
			consumed := data[len(data)-before : len(data)-r.Len()]
			if enc := appendFrame(nil, fr); !bytes.Equal(enc, consumed) {
				t.Fatalf("decoded %x as %+v, which encodes as %x", consumed, fr, enc)
			}
		}
	})
}

// FuzzOpen: as FuzzFrames, for ReadOpen.
func FuzzOpen(f *testing.F) {
	id := mkID(1)
	f.Add(append([]byte{1}, id[:]...))
	f.Add(append([]byte{2}, id[:]...))
	f.Add(append([]byte{1}, make([]byte, 16)...))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		got, err := ReadOpen(r)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error %v does not wrap ErrProtocol", err)
			}
			return
		}
		var buf bytes.Buffer
		if err := WriteOpen(&buf, got); err != nil {
			t.Fatalf("decoded %v does not re-encode: %v", got, err)
		}
		if consumed := data[:len(data)-r.Len()]; !bytes.Equal(buf.Bytes(), consumed) {
			t.Fatalf("decoded %x as %v, which encodes as %x", consumed, got, buf.Bytes())
		}
	})
}

// FuzzResumeRequest: as FuzzFrames, for ReadResumeRequest.
func FuzzResumeRequest(f *testing.F) {
	id := mkID(1)
	f.Add(append(append([]byte{1}, id[:]...), 0, 0, 0, 0, 0, 0, 1, 0))
	f.Add(append(append([]byte{1}, id[:]...), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff))
	f.Add(append([]byte{1}, make([]byte, 24)...))
	f.Add(append([]byte{9}, id[:]...))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		got, err := ReadResumeRequest(r)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error %v does not wrap ErrProtocol", err)
			}
			return
		}
		var buf bytes.Buffer
		if err := WriteResumeRequest(&buf, got); err != nil {
			t.Fatalf("decoded %+v does not re-encode: %v", got, err)
		}
		if consumed := data[:len(data)-r.Len()]; !bytes.Equal(buf.Bytes(), consumed) {
			t.Fatalf("decoded %x as %+v, which encodes as %x", consumed, got, buf.Bytes())
		}
	})
}

// FuzzResumeAnswer: as FuzzFrames, for ReadResumeAnswer.
func FuzzResumeAnswer(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0})
	f.Add(append([]byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7}, "expired"...))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 'x'})
	f.Add([]byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0})
	f.Add([]byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0xc3, 0x28})
	f.Add([]byte{1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		got, err := ReadResumeAnswer(r)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error %v does not wrap ErrProtocol", err)
			}
			return
		}
		var buf bytes.Buffer
		if err := WriteResumeAnswer(&buf, got); err != nil {
			t.Fatalf("decoded %+v does not re-encode: %v", got, err)
		}
		if consumed := data[:len(data)-r.Len()]; !bytes.Equal(buf.Bytes(), consumed) {
			t.Fatalf("decoded %x as %+v, which encodes as %x", consumed, got, buf.Bytes())
		}
	})
}

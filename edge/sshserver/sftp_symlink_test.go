package sshserver

import (
	"bytes"
	"encoding/binary"
	"io"
	"testing"
)

// sftpPacket builds one SFTP packet: type, request id 7, then SSH strings.
func sftpPacket(typ byte, strs ...string) []byte {
	body := []byte{typ, 0, 0, 0, 7}
	for _, s := range strs {
		body = binary.BigEndian.AppendUint32(body, uint32(len(s)))
		body = append(body, s...)
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

type nopRWC struct{ io.Reader }

func (nopRWC) Write(p []byte) (int, error) { return len(p), nil }
func (nopRWC) Close() error                { return nil }

// filterAll runs in through a symlinkFilter that records the links it
// would create, and returns what pkg/sftp would read.
func filterAll(in []byte) (out []byte, links [][2]string, err error) {
	f := newSymlinkFilter(nopRWC{bytes.NewReader(in)}, "/home/op")
	f.symlink = func(target, link string) error {
		links = append(links, [2]string{target, link})
		return nil
	}
	out, err = io.ReadAll(f)
	return out, links, err
}

func TestSymlinkFilter(t *testing.T) {
	other := sftpPacket(17, "/etc/hostname") // SSH_FXP_STAT
	for _, tc := range []struct {
		name      string
		in        []byte
		wantLinks [][2]string
		unchanged bool
	}{
		{"other packets pass", other, nil, true},
		{"absolute target passes", sftpPacket(sftpSymlink, "/lib/x", "link"), nil, true},
		{"relative target created as given", sftpPacket(sftpSymlink, "../lib/x", "/home/op/link"),
			[][2]string{{"../lib/x", "/home/op/link"}}, false},
		{"relative link path is in the working directory", sftpPacket(sftpSymlink, "x", "sub/link"),
			[][2]string{{"x", "/home/op/sub/link"}}, false},
		{"truncated packet passes", sftpPacket(sftpSymlink, "x", "y")[:12], nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append(slicesClone(tc.in), other...)
			out, links, err := filterAll(in)
			if err != nil {
				t.Fatal(err)
			}
			if len(links) != len(tc.wantLinks) || (len(links) > 0 && links[0] != tc.wantLinks[0]) {
				t.Fatalf("links %q, want %q", links, tc.wantLinks)
			}
			if tc.unchanged != bytes.Equal(out, in) {
				t.Fatalf("output changed=%v: %x", !tc.unchanged, out)
			}
			if !tc.unchanged {
				// The replacement is a no-op SETSTAT with the same id,
				// followed by the untouched next packet.
				_, rest, _ := sftpString(tc.in[9:])
				link, _, _ := sftpString(rest)
				want := append(sftpPacket(sftpSetstat, link), 0, 0, 0, 0)
				binary.BigEndian.PutUint32(want, uint32(len(want)-4))
				if !bytes.Equal(out, append(want, other...)) {
					t.Fatalf("output %x, want %x", out, append(want, other...))
				}
			}
		})
	}
}

func slicesClone(b []byte) []byte { return append([]byte(nil), b...) }

// FuzzSymlinkFilter: no input panics or hangs the filter, and a stream that
// creates no link passes through byte for byte (a truncated final SYMLINK
// packet may be cut, since the channel is ending anyway).
func FuzzSymlinkFilter(f *testing.F) {
	// A relative symlink, as OpenSSH's sftp sends for ln -s ../x link.
	f.Add(sftpPacket(sftpSymlink, "../x", "/home/op/link"))
	// A stat, passed through.
	f.Add(sftpPacket(17, "/etc/hostname"))
	// A symlink packet whose strings overrun it.
	f.Add([]byte{0, 0, 0, 9, sftpSymlink, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, sftpSymlink})
	f.Fuzz(func(t *testing.T, in []byte) {
		out, links, err := filterAll(in)
		if err == nil && len(links) == 0 && !bytes.Equal(out, in) {
			t.Fatalf("no link created, yet the stream changed: %x -> %x", in, out)
		}
	})
}

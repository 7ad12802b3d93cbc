package sshserver

import (
	"bufio"
	"encoding/binary"
	"io"
	"os"
	"path"
)

// SFTP packet types this file looks at (draft-ietf-secsh-filexfer-02).
const (
	sftpSetstat = 9
	sftpSymlink = 20
)

// maxSymlinkPacket bounds the SYMLINK packets symlinkFilter buffers (two
// paths); longer ones pass through untouched.
const maxSymlinkPacket = 64 << 10

// symlinkFilter sits between the SFTP channel and pkg/sftp's server to keep
// symlink targets as the client gave them. pkg/sftp, serving from a working
// directory, joins a relative target with that directory, so "ln -s
// ../lib/x link" would store an absolute path; OpenSSH's sftp-server stores
// the target verbatim (a symlink's target is relative to the link, not to
// the session's directory). The filter creates such links itself and hands
// pkg/sftp a no-op SETSTAT with the same request id, whose OK status is the
// answer; if creating the link fails, the original packet goes on and
// pkg/sftp reports the same failure (it depends on the link's path only).
type symlinkFilter struct {
	io.ReadWriteCloser
	r       *bufio.Reader
	workDir string
	pending []byte                          // bytes of the current packet not yet returned
	left    uint32                          // bytes of the current packet still to pass through from r
	symlink func(target, link string) error // os.Symlink; replaced in tests
}

func newSymlinkFilter(rwc io.ReadWriteCloser, workDir string) *symlinkFilter {
	return &symlinkFilter{ReadWriteCloser: rwc, r: bufio.NewReader(rwc), workDir: workDir, symlink: os.Symlink}
}

// Read implements io.Reader over the (possibly rewritten) packet stream.
func (f *symlinkFilter) Read(p []byte) (int, error) {
	if len(f.pending) > 0 {
		n := copy(p, f.pending)
		f.pending = f.pending[n:]
		return n, nil
	}
	if f.left > 0 {
		n, err := f.r.Read(p[:min(uint32(len(p)), f.left)])
		f.left -= uint32(n)
		return n, err
	}
	hdr, err := f.r.Peek(5)
	if err != nil {
		if len(hdr) == 0 {
			return 0, err
		}
		// A truncated header: pass what there is, pkg/sftp reports it.
		return f.r.Read(p)
	}
	length := binary.BigEndian.Uint32(hdr)
	if hdr[4] != sftpSymlink || length > maxSymlinkPacket || length < 1 {
		f.left = 4 + length
		return f.Read(p)
	}
	pkt := make([]byte, 4+length)
	if _, err := io.ReadFull(f.r, pkt); err != nil {
		return 0, err
	}
	f.pending = f.rewrite(pkt)
	return f.Read(p)
}

// rewrite handles one SYMLINK packet (length, type, id, target, link) and
// returns the packet to pass on.
func (f *symlinkFilter) rewrite(pkt []byte) []byte {
	body := pkt[5:]
	if len(body) < 4 {
		return pkt
	}
	id := body[:4]
	target, rest, ok := sftpString(body[4:])
	if !ok {
		return pkt
	}
	link, _, ok := sftpString(rest)
	if !ok || path.IsAbs(target) || target == "" {
		return pkt
	}
	local := link
	if !path.IsAbs(local) {
		local = path.Join(f.workDir, local)
	}
	if err := f.symlink(target, local); err != nil {
		return pkt
	}
	// SETSTAT id, path, attrs with flags 0: answers OK, changes nothing.
	out := make([]byte, 0, 4+1+4+4+len(link)+4)
	out = binary.BigEndian.AppendUint32(out, uint32(1+4+4+len(link)+4))
	out = append(out, sftpSetstat)
	out = append(out, id...)
	out = binary.BigEndian.AppendUint32(out, uint32(len(link)))
	out = append(out, link...)
	out = binary.BigEndian.AppendUint32(out, 0)
	return out
}

// sftpString decodes an SSH string (uint32 length, bytes).
func sftpString(b []byte) (s string, rest []byte, ok bool) {
	if len(b) < 4 {
		return "", nil, false
	}
	n := binary.BigEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-4) {
		return "", nil, false
	}
	return string(b[4 : 4+n]), b[4+n:], true
}

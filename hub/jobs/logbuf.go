package jobs

// logBuf keeps the first headCap and the last tailCap bytes of a run's
// output: the head shows how it started (the command, early errors), the
// tail how it ended; the middle of a chatty run is dropped and counted.
type logBuf struct {
	head  []byte
	tail  []byte // ring of at most tailCap bytes once the head is full
	start int    // index of the oldest byte in tail when it is full
	total int64
}

const (
	headCap = 64 << 10
	tailCap = 64 << 10
)

func (l *logBuf) write(p []byte) {
	l.total += int64(len(p))
	if n := min(headCap-len(l.head), len(p)); n > 0 {
		l.head = append(l.head, p[:n]...)
		p = p[n:]
	}
	if len(p) == 0 {
		return
	}
	if len(p) >= tailCap {
		l.tail = append(l.tail[:0], p[len(p)-tailCap:]...)
		l.start = 0
		return
	}
	if room := tailCap - len(l.tail); room > 0 {
		n := min(room, len(p))
		l.tail = append(l.tail, p[:n]...)
		p = p[n:]
	}
	for len(p) > 0 { // full ring: overwrite the oldest bytes
		n := copy(l.tail[l.start:], p)
		p = p[n:]
		l.start = (l.start + n) % tailCap
	}
}

// snapshot returns copies of the head and the tail (in order) and how many
// bytes were dropped between them.
func (l *logBuf) snapshot() (head, tail []byte, dropped int64) {
	head = append([]byte(nil), l.head...)
	tail = make([]byte, 0, len(l.tail))
	tail = append(tail, l.tail[l.start:]...)
	tail = append(tail, l.tail[:l.start]...)
	return head, tail, l.total - int64(len(head)) - int64(len(tail))
}

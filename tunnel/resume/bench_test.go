package resume

import (
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel"
)

// cpuTime is this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkThroughput pushes data hub -> agent over one loopback tunnel
// stream, raw and through the resume layer, so the layer's cost shows as
// the difference in MB/s (go test reports it from SetBytes). The shape is
// tunnel's BenchmarkStreamThroughput: 64 KiB writes, a reader copying to
// io.Discard. Both ends run in this process, so cpu-ns/KiB (user+system CPU
// per KiB moved, both ends together) is the cost that does not depend on
// what else the machine runs, as MB/s does.
//
// The "paced" runs write 16 KiB at a time, each once the reader (reading
// 64 KiB at a time, as tunnel.Pipe does) has the one before: every write
// crosses as a frame of its own, as a jump's do when the hub keeps up with
// the operator's SSH packets (at most 32 KiB each).
func BenchmarkThroughput(b *testing.B) {
	for _, paced := range []bool{false, true} {
		for _, tr := range transports {
			for _, layer := range []string{"raw", "resume"} {
				name := tr.String() + "/" + layer
				if paced {
					name += "/paced"
				}
				b.Run(name, func(b *testing.B) { benchmarkThroughput(b, tr, layer, paced) })
			}
		}
	}
}

func benchmarkThroughput(b *testing.B, tr tunnel.Transport, layer string, paced bool) {
	chunk := 64 << 10
	if paced {
		chunk = 16 << 10
	}
	agentSess, hubSess := dial(b, startListener(b), tr)
	id := NewID()
	hu, au := openUnder(b, hubSess, agentSess, id)
	var w, r net.Conn = hu, au
	if layer == "resume" {
		hs, as := New(id, hu, Config{}), New(id, au, Config{})
		b.Cleanup(func() { hs.Abort("done"); as.Abort("done") })
		w, r = hs, as
	} else {
		b.Cleanup(func() { _ = hu.Close(); _ = au.Close() })
	}
	drained := make(chan error, 1)
	got := make(chan struct{}, 1) // paced: a chunk was read
	go func() {
		if !paced {
			_, err := io.Copy(io.Discard, r)
			drained <- err
			return
		}
		buf := make([]byte, 64<<10)
		var n int
		for {
			k, err := r.Read(buf)
			if n += k; n >= chunk {
				n -= chunk
				got <- struct{}{}
			}
			if err == io.EOF {
				err = nil
			}
			if err != nil || k == 0 {
				drained <- err
				return
			}
		}
	}()
	buf := make([]byte, chunk)
	b.SetBytes(int64(chunk))
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for range b.N {
		if _, err := w.Write(buf); err != nil {
			b.Fatal(err)
		}
		if paced {
			<-got
		}
	}
	if err := w.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		b.Fatal(err)
	}
	if err := <-drained; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N)/float64(chunk>>10), "cpu-ns/KiB")
}

// BenchmarkRelay is the path of a jump or a forward, in one process: bytes
// written to a TCP connection are relayed by tunnel.Pipe (the hub's side)
// into a tunnel stream, raw or resumable, and by tunnel.Pipe again (the
// agent's side) into a TCP connection to a sink that discards them. Unlike
// BenchmarkThroughput, the stream's writes and reads are what Pipe makes of
// TCP reads of varying sizes, as in the product.
func BenchmarkRelay(b *testing.B) {
	const chunk = 64 << 10
	for _, tr := range transports {
		for _, layer := range []string{"raw", "resume"} {
			b.Run(tr.String()+"/"+layer, func(b *testing.B) {
				agentSess, hubSess := dial(b, startListener(b), tr)
				id := NewID()
				hu, au := openUnder(b, hubSess, agentSess, id)
				var hs, as tunnel.Stream = hu, au
				if layer == "resume" {
					hs, as = New(id, hu, Config{}), New(id, au, Config{})
				}
				sink := listenTCP(b)
				front := listenTCP(b)
				received := make(chan int64, 1)
				go func() {
					c, err := sink.Accept()
					if err != nil {
						received <- -1
						return
					}
					n, _ := io.Copy(io.Discard, c)
					_ = c.Close()
					received <- n
				}()
				var relays sync.WaitGroup
				relays.Go(func() {
					c, err := front.Accept()
					if err != nil {
						_ = hs.Close()
						return
					}
					tunnel.Pipe(c, hs, nil)
				})
				relays.Go(func() {
					c, err := net.Dial("tcp", sink.Addr().String())
					if err != nil {
						_ = as.Close()
						return
					}
					tunnel.Pipe(as, c, nil)
				})
				src, err := net.Dial("tcp", front.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				buf := make([]byte, chunk)
				b.SetBytes(chunk)
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := cpuTime()
				for range b.N {
					if _, err := src.Write(buf); err != nil {
						b.Fatal(err)
					}
				}
				_ = src.(*net.TCPConn).CloseWrite()
				if n := <-received; n != int64(b.N)*chunk {
					b.Fatalf("the sink received %d bytes, want %d", n, int64(b.N)*chunk)
				}
				b.StopTimer()
				b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N)/(chunk>>10), "cpu-ns/KiB")
				_ = src.Close()
				relays.Wait()
			})
		}
	}
}

func listenTCP(b *testing.B) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ln.Close() })
	return ln
}

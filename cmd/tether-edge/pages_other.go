//go:build !linux

package main

// releaseExePages is Linux-only (see pages_linux.go).
func releaseExePages() (int64, error) { return 0, nil }

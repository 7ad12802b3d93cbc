package pki

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"fmt"
	"regexp"
	"strings"
)

// A join token is "ID.SECRET" (kubeadm style): the ID is a public handle used
// to find the record; only SHA-256(SECRET) is stored and it is compared in
// constant time.
var (
	tokenIDRE     = regexp.MustCompile(`^[a-z2-7]{8}$`)
	tokenSecretRE = regexp.MustCompile(`^[a-z2-7]{32}$`)
	b32           = base32.StdEncoding.WithPadding(base32.NoPadding)
)

// NewToken returns a fresh token id and secret (40 and 160 bits of entropy).
func NewToken() (id, secret string, err error) {
	buf := make([]byte, 5+20)
	if _, err := rand.Read(buf); err != nil {
		return "", "", fmt.Errorf("pki: token randomness: %w", err)
	}
	return strings.ToLower(b32.EncodeToString(buf[:5])), strings.ToLower(b32.EncodeToString(buf[5:])), nil
}

// SplitToken parses "ID.SECRET".
func SplitToken(token string) (id, secret string, err error) {
	id, secret, ok := strings.Cut(token, ".")
	if !ok || !tokenIDRE.MatchString(id) || !tokenSecretRE.MatchString(secret) {
		return "", "", fmt.Errorf("malformed join token: want ID.SECRET (8 and 32 base32 characters)")
	}
	return id, secret, nil
}

// HashSecret is what the hub stores for a token secret.
func HashSecret(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// SecretMatches compares a presented secret against a stored hash in constant time.
func SecretMatches(storedHash []byte, secret string) bool {
	return subtle.ConstantTimeCompare(storedHash, HashSecret(secret)) == 1
}

package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TLSFiles are a throwaway certificate authority and the certificates it signed for a
// server (127.0.0.1 and localhost) and a client, as PEM files in a test's temporary
// directory.
type TLSFiles struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
}

// NewTLSFiles generates a CA and its server and client certificates, valid for an hour.
func NewTLSFiles(t testing.TB) *TLSFiles {
	t.Helper()
	dir := t.TempDir()
	caKey, caCert := newCert(t, "cpcache test CA", nil, nil, func(c *x509.Certificate) {
		c.IsCA, c.BasicConstraintsValid = true, true
		c.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	})
	f := &TLSFiles{CA: filepath.Join(dir, "ca.pem")}
	writePEM(t, f.CA, "CERTIFICATE", caCert.Raw)
	for _, side := range []struct {
		name      string
		usage     x509.ExtKeyUsage
		cert, key *string
	}{
		{"server", x509.ExtKeyUsageServerAuth, &f.ServerCert, &f.ServerKey},
		{"client", x509.ExtKeyUsageClientAuth, &f.ClientCert, &f.ClientKey},
	} {
		key, cert := newCert(t, "cpcache test "+side.name, caCert, caKey, func(c *x509.Certificate) {
			c.ExtKeyUsage = []x509.ExtKeyUsage{side.usage}
			c.KeyUsage = x509.KeyUsageDigitalSignature
			c.DNSNames = []string{"localhost"}
			c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		})
		*side.cert, *side.key = filepath.Join(dir, side.name+".pem"), filepath.Join(dir, side.name+"-key.pem")
		writePEM(t, *side.cert, "CERTIFICATE", cert.Raw)
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		writePEM(t, *side.key, "PRIVATE KEY", der)
	}
	return f
}

// Query is the URL query that makes a cpcache rediss:// URL trust the CA and present the
// client certificate.
func (f *TLSFiles) Query() string {
	return url.Values{"tls_ca": {f.CA}, "tls_cert": {f.ClientCert}, "tls_key": {f.ClientKey}}.Encode()
}

// ClientConfig is a client's TLS configuration for the server.
func (f *TLSFiles) ClientConfig(t testing.TB) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(f.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	pair, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// newCert makes a P-256 key and a certificate for it, signed by parent (self-signed when
// parent is nil).
func newCert(t testing.TB, cn string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, edit func(*x509.Certificate)) (*ecdsa.PrivateKey, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
	}
	edit(tmpl)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert
}

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

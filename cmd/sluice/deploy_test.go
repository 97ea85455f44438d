package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// upstreamMessageLimit is nostr-rs-relay's default max_ws_message_bytes
// (128 KiB), the relay behind sluice proxy in docker-compose.yml.
const upstreamMessageLimit = 128 << 10

// composeFile is the part of docker-compose.yml these tests read.
type composeFile struct {
	Services map[string]struct {
		Image string `yaml:"image"`
		Build *struct {
			Context string            `yaml:"context"`
			Args    map[string]string `yaml:"args"`
		} `yaml:"build"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		Healthcheck *struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
	} `yaml:"services"`
}

func readCompose(t *testing.T) composeFile {
	t.Helper()
	data, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	if len(c.Services) == 0 {
		t.Fatal("docker-compose.yml has no services")
	}
	return c
}

func readDockerfile(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// entrypoint is the path of the binary in the image, from the Dockerfile's
// ENTRYPOINT.
func entrypoint(t *testing.T, dockerfile string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^ENTRYPOINT \["([^"]+)"\]`).FindStringSubmatch(dockerfile)
	if m == nil {
		t.Fatal("Dockerfile has no ENTRYPOINT [\"…\"]")
	}
	return m[1]
}

// TestComposeImagesPinned: every image is a fixed version, never latest or
// a bare major; the sluice services are built with the version passed in.
func TestComposeImagesPinned(t *testing.T) {
	c := readCompose(t)
	version := regexp.MustCompile(`^[^:@]+:v?\d+\.\d+\.\d+([-.][A-Za-z0-9.]+)?(@sha256:[0-9a-f]{64})?$`)
	for name, s := range c.Services {
		if s.Build != nil {
			if s.Build.Args["VERSION"] == "" {
				t.Errorf("service %s is built without the VERSION build arg", name)
			}
			continue
		}
		if !version.MatchString(s.Image) {
			t.Errorf("service %s: image %q is not pinned to a version", name, s.Image)
		}
	}
}

// TestDockerfileStampsVersion: the VERSION build arg reaches the binary
// (-X main.version) and the image's label.
func TestDockerfileStampsVersion(t *testing.T) {
	d := readDockerfile(t)
	for _, want := range []string{"ARG VERSION=dev", "-X main.version=${VERSION}", `org.opencontainers.image.version="${VERSION}"`} {
		if !strings.Contains(d, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	if n := strings.Count(d, "ARG VERSION"); n != 2 {
		t.Errorf("ARG VERSION appears %d times, want 2 (each stage that uses it declares it)", n)
	}
}

// TestHealthchecksUseTheBinary: the distroless image has no shell or curl,
// so each health check runs sluice's own "health" command at the path the
// image installs it.
func TestHealthchecksUseTheBinary(t *testing.T) {
	d := readDockerfile(t)
	bin := entrypoint(t, d)
	if !strings.Contains(d, `CMD ["`+bin+`", "health"]`) {
		t.Errorf("Dockerfile's HEALTHCHECK does not run %s health", bin)
	}
	c := readCompose(t)
	for name, s := range c.Services {
		if s.Build == nil {
			continue
		}
		if s.Healthcheck == nil || !slices.Equal(s.Healthcheck.Test, []string{"CMD", bin, "health"}) {
			t.Errorf("service %s: healthcheck %+v, want [CMD %s health]", name, s.Healthcheck, bin)
		}
	}
}

// TestComposeProxyFrameBound: sluice proxy in front of nostr-rs-relay
// reads no frame larger than the relay accepts, from a config file that
// sluice accepts.
func TestComposeProxyFrameBound(t *testing.T) {
	c := readCompose(t)
	s, ok := c.Services["sluice-proxy"]
	if !ok {
		t.Fatal("no sluice-proxy service")
	}
	path := s.Environment["SLUICE_CONFIG"]
	if path == "" {
		t.Fatal("sluice-proxy sets no SLUICE_CONFIG")
	}
	var host string
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[1] == path {
			host = parts[0]
		}
	}
	if host == "" {
		t.Fatalf("sluice-proxy mounts nothing at %s", path)
	}
	env := map[string]string{"SLUICE_CONFIG": filepath.Join("../..", host)}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"check"}, func(k string) string { return env[k] }, &stdout, &stderr); code != 0 {
		t.Fatalf("sluice check on %s: exit %d\n%s", host, code, stderr.String())
	}
	fc, err := loadConfigFile(filepath.Join("../..", host))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := fc.validate()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ReadLimit > upstreamMessageLimit {
		t.Errorf("sluice-proxy read_limit %d is above nostr-rs-relay's %d: it would forward frames the relay refuses", cfg.ReadLimit, upstreamMessageLimit)
	}
	for typ, n := range cfg.FrameSize {
		if int64(n) > upstreamMessageLimit {
			t.Errorf("frame_size of type %d is %d, above nostr-rs-relay's %d", typ, n, upstreamMessageLimit)
		}
	}
}

// TestVersionStamped: a version set with -X main.version is what the
// binary reports, and what sluice_build_info carries.
func TestVersionStamped(t *testing.T) {
	old := version
	version = "v1.2.3-test"
	defer func() { version = old }()
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"version"}, func(string) string { return "" }, &stdout, &stderr); code != 0 || stdout.String() != "sluice v1.2.3-test\n" {
		t.Errorf("sluice version: exit %d %q", code, stdout.String())
	}
	if body := scrape(t, newMetrics()); !strings.Contains(body, `sluice_build_info{version="v1.2.3-test"} 1`) {
		t.Error("sluice_build_info does not carry the stamped version")
	}
}

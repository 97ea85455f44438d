package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestComposeScaleOut: deploy/compose/scale-out.yml runs at least two
// sluice relays on one PostgreSQL and one Redis behind one port: every
// relay names the same database and Redis, nginx sends to each of them,
// images are pinned, and the config it mounts is valid and trusts the
// load balancer's address.
func TestComposeScaleOut(t *testing.T) {
	data, err := os.ReadFile("../../deploy/compose/scale-out.yml")
	if err != nil {
		t.Fatal(err)
	}
	// Compose fills ${VAR:-default} in; the defaults are what runs.
	data = regexp.MustCompile(`\$\{[A-Z_]+:-([^}]*)\}`).ReplaceAll(data, []byte("$1"))
	var c struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Command     []string          `yaml:"command"`
			Environment map[string]string `yaml:"environment"`
			Volumes     []string          `yaml:"volumes"`
			Ports       []string          `yaml:"ports"`
			Networks    map[string]struct {
				IPv4 string `yaml:"ipv4_address"`
			} `yaml:"networks"`
		} `yaml:"services"`
	}
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&c); err != nil {
		t.Fatalf("scale-out.yml: %v", err)
	}
	nginx, err := os.ReadFile("../../deploy/compose/scale-out-nginx.conf")
	if err != nil {
		t.Fatal(err)
	}
	// PostgreSQL's images are versioned major.minor.
	pinned := regexp.MustCompile(`^[^:@]+:v?\d+\.\d+(\.\d+)?([-.][A-Za-z0-9.]+)?$`)
	var relays []string
	database, redis := "", ""
	for name, s := range c.Services {
		if !strings.HasPrefix(s.Image, "sluice:") && !pinned.MatchString(s.Image) {
			t.Errorf("service %s: image %q is not pinned to a version", name, s.Image)
		}
		if len(s.Command) == 0 || s.Command[0] != "relay" {
			continue
		}
		relays = append(relays, name)
		if database == "" {
			database, redis = s.Environment["SLUICE_DATABASE"], s.Environment["SLUICE_REDIS"]
		}
		if !strings.HasPrefix(s.Environment["SLUICE_DATABASE"], "postgres://") || s.Environment["SLUICE_DATABASE"] != database {
			t.Errorf("service %s: SLUICE_DATABASE %q, want the one postgres:// database of all", name, s.Environment["SLUICE_DATABASE"])
		}
		if s.Environment["SLUICE_REDIS"] == "" || s.Environment["SLUICE_REDIS"] != redis {
			t.Errorf("service %s: SLUICE_REDIS %q, want the one Redis of all", name, s.Environment["SLUICE_REDIS"])
		}
		if !strings.Contains(string(nginx), "server "+name+":7777;") {
			t.Errorf("nginx does not send clients to %s", name)
		}
	}
	if len(relays) < 2 {
		t.Fatalf("%d sluice relays, want at least 2", len(relays))
	}
	if _, ok := c.Services["postgres"]; !ok {
		t.Error("no postgres service")
	}
	lb := c.Services["lb"]
	if len(lb.Ports) != 1 {
		t.Errorf("lb publishes %v, want one port", lb.Ports)
	}
	fc, err := loadConfigFile("../../deploy/compose/scale-out.yaml")
	if err != nil {
		t.Fatal(err)
	}
	fc.Database = database
	if _, err := fc.validate(); err != nil {
		t.Fatalf("scale-out.yaml with its database: %v", err)
	}
	ip := lb.Networks["default"].IPv4
	if ip == "" || len(fc.Identity.TrustedProxies) != 1 || fc.Identity.TrustedProxies[0] != ip+"/32" {
		t.Errorf("trusted_proxies %v, want the load balancer's %s/32", fc.Identity.TrustedProxies, ip)
	}
}

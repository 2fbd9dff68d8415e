package request

import (
	"strings"
	"testing"
)

func TestPickerValues(t *testing.T) {
	for _, c := range []struct {
		s                   string
		fairness, objective bool
	}{
		{"acme", true, true},
		{"acme-prod.eu", true, true},
		{"Acme", true, false},
		{"team/search@acme:1+x~_", true, false},
		{"", false, false},
		{"-critical", true, false},
		{"critical.", true, false},
		{"a b", false, false},
		{"a,b", false, false},
		{"a\r\nx-evil: 1", false, false},
		{"é", false, false},
		{strings.Repeat("a", MaxFairnessIDBytes), true, true},
		{strings.Repeat("a", MaxFairnessIDBytes+1), false, true},
		{strings.Repeat("a", MaxObjectiveBytes+1), false, false},
	} {
		if got := ValidFairnessID(c.s); got != c.fairness {
			t.Errorf("ValidFairnessID(%q) = %v, want %v", c.s, got, c.fairness)
		}
		if got := ValidObjective(c.s); got != c.objective {
			t.Errorf("ValidObjective(%q) = %v, want %v", c.s, got, c.objective)
		}
	}
}

// A tenant goes to the picker as it is when it can, else as a hash that
// no tenant's own name can equal.
func TestTenantFairnessID(t *testing.T) {
	if got := TenantFairnessID("acme"); got != "acme" {
		t.Errorf("TenantFairnessID(acme) = %q", got)
	}
	if got := TenantFairnessID(""); got != "" {
		t.Errorf("no tenant: %q, want none", got)
	}
	for _, tenant := range []string{"Acme Corp", "a,b", strings.Repeat("x", MaxFairnessIDBytes+1), "é"} {
		got := TenantFairnessID(tenant)
		if !strings.HasPrefix(got, "sha256=") || len(got) != len("sha256=")+32 || ValidFairnessID(got) {
			t.Errorf("TenantFairnessID(%q) = %q, want sha256= and 32 hex digits", tenant, got)
		}
		if TenantFairnessID(tenant+"x") == got {
			t.Errorf("%q and %q share a fairness id", tenant, tenant+"x")
		}
	}
}

// Whatever the tenant, its fairness id is header-safe and bounded.
func FuzzTenantFairnessID(f *testing.F) {
	for _, s := range []string{"acme", "", "Acme Corp", "a\r\nb", "sha256=00", strings.Repeat("x", 200)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tenant string) {
		got := TenantFairnessID(tenant)
		switch {
		case tenant == "":
			if got != "" {
				t.Fatalf("no tenant: %q", got)
			}
		case got == tenant:
			if !ValidFairnessID(got) {
				t.Fatalf("%q sent as it is, but not a valid fairness id", tenant)
			}
		case !strings.HasPrefix(got, "sha256=") || len(got) != 39 || ValidFairnessID(tenant):
			t.Fatalf("TenantFairnessID(%q) = %q", tenant, got)
		}
	})
}

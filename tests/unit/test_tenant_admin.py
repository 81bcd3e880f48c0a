"""The tenants file as ``sandhold tenant`` writes it: read back by the server's own loader,
keys only as hashes, rotation touching one tenant, concurrent additions all kept."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from orchestrator._core.tenant_admin import add_tenant, parse_quotas, read_tenants, rotate_key
from orchestrator._core.tenants import TenantKeys
from orchestrator.errors import InvalidArgumentError, TenantsFileError


def test_what_add_writes_the_server_loads_and_the_key_authenticates(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    quotas = parse_quotas(["sessions=3", "cpus=1.5", "memory_mb=2048"])
    key = add_tenant(path, "team-a", policies=("default", "strict"), quotas=quotas)
    other = add_tenant(path, "team-b")
    (first, second) = read_tenants(path)
    assert first.policies == ("default", "strict") and first.quotas == quotas
    assert second.policies is None and second.quotas.sessions is None
    keys = TenantKeys.from_file(path)
    assert keys.tenant_for(key) == "team-a" and keys.tenant_for(other) == "team-b"
    assert key not in path.read_text() and path.stat().st_mode & 0o777 == 0o600


def test_rotate_replaces_one_key_and_keeps_everything_else(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    old = add_tenant(path, "team-a", quotas=parse_quotas(["sessions=2"]))
    kept = add_tenant(path, "team-b")
    new = rotate_key(path, "team-a")
    keys = TenantKeys.from_file(path)
    assert keys.tenant_for(old) is None and keys.tenant_for(new) == "team-a"
    assert keys.tenant_for(kept) == "team-b"
    assert read_tenants(path)[0].quotas.sessions == 2


def test_an_egress_cap_is_written_read_back_and_kept_by_every_later_rewrite(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tenants.toml"
    cap = ("pypi.org:443", "*.pythonhosted.org")
    add_tenant(path, "team-a", quotas=parse_quotas(["egress_mb=5"]), egress_allow=cap)
    add_tenant(path, "team-b")  # a rewrite of the whole file
    rotate_key(path, "team-a")  # and another
    first, second = read_tenants(path)
    assert first.egress_allow == cap and first.quotas.egress_mb == 5
    assert second.egress_allow is None
    with pytest.raises(TenantsFileError, match="egress_allow"):
        add_tenant(path, "team-c", egress_allow=("10.0.0.1",))


def test_unknown_quotas_bad_names_and_unknown_tenants_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    with pytest.raises(InvalidArgumentError):
        parse_quotas(["sesions=1"])
    with pytest.raises(InvalidArgumentError):
        parse_quotas(["sessions=-1"])
    with pytest.raises(TenantsFileError) as bad:
        add_tenant(path, "Team A")
    assert bad.value.key == "name" and not path.exists()
    with pytest.raises(InvalidArgumentError):
        rotate_key(path, "nobody")


def test_concurrent_additions_are_all_kept(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    names = [f"t{i}" for i in range(8)]
    threads = [threading.Thread(target=add_tenant, args=(path, name)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(t.name for t in read_tenants(path)) == names


def test_an_operator_key_is_no_tenants_and_survives_every_rewrite(tmp_path: Path) -> None:
    from orchestrator._core.tenant_admin import add_operator, read_operators

    path = tmp_path / "tenants.toml"
    with pytest.raises(InvalidArgumentError, match="add a tenant first"):
        add_operator(path, "ops")
    tenant = add_tenant(path, "team-a")
    operator = add_operator(path, "ops")
    with pytest.raises(InvalidArgumentError, match="exists"):
        add_tenant(path, "ops")
    add_tenant(path, "team-b")
    keys = TenantKeys.from_file(path)
    assert keys.role_for(operator) == ("ops", None, True)
    assert keys.tenant_for(operator) is None
    assert keys.role_for(tenant) == ("team-a", "team-a", False)
    rotated = rotate_key(path, "ops")
    keys = TenantKeys.from_file(path)
    assert keys.role_for(operator) is None and keys.role_for(rotated) == ("ops", None, True)
    assert [o.name for o in read_operators(path)] == ["ops"]
    assert operator not in path.read_text() and rotated not in path.read_text()

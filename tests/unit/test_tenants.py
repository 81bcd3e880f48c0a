"""API keys and tenants: hashed keys, tenants files refused with file, key and reason, and the
local tenant's key made once (mode 0600) and reused."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest

from orchestrator._core.tenants import (
    LOCAL_KEY_FILE,
    LOCAL_TENANT,
    TenantKeys,
    TenantQuotas,
    data_dir,
    hash_key,
    load_tenants_file,
    local_key,
    local_tenant,
    new_key,
)
from orchestrator.errors import InvalidArgumentError, TenantsFileError


def tenants_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tenants.toml"
    path.write_text(text)
    return path


def entry(name: str, key: str) -> str:
    return f'[[tenant]]\nname = "{name}"\nkey_sha256 = "{hash_key(key)}"\n'


def test_a_key_is_stored_as_its_sha256() -> None:
    key = new_key()
    assert hash_key(key) == hashlib.sha256(key.encode()).hexdigest()
    assert key not in hash_key(key)


def test_new_keys_are_long_and_distinct() -> None:
    keys = {new_key() for _ in range(100)}
    assert len(keys) == 100
    assert all(len(k) >= 40 and k.startswith("sandhold_") for k in keys)


def test_each_key_names_its_own_tenant(tmp_path: Path) -> None:
    a, b = new_key(), new_key()
    keys = TenantKeys.from_file(tenants_file(tmp_path, entry("team-a", a) + entry("team-b", b)))
    assert keys.tenant_for(a) == "team-a"
    assert keys.tenant_for(b) == "team-b"


@pytest.mark.parametrize(
    "presented", ["", "short", new_key(), "x" * 10_000, "sandhold_\udc80" + "a" * 40]
)
def test_a_wrong_key_names_no_tenant(presented: str) -> None:
    assert TenantKeys.single("t", new_key()).tenant_for(presented) is None


def test_a_tenants_file_error_is_an_invalid_argument_naming_file_key_and_reason(
    tmp_path: Path,
) -> None:
    path = tenants_file(tmp_path, '[[tenant]]\nname = "a"\nkey_sha256 = "nothex"\n')
    with pytest.raises(TenantsFileError) as caught:
        load_tenants_file(path)
    error = caught.value
    assert isinstance(error, InvalidArgumentError) and error.code == "invalid_argument"
    assert (error.file, error.key) == (str(path), "tenant.0.key_sha256")
    assert str(path) in str(error) and "tenant.0.key_sha256" in str(error)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[[tenant]]\nname = "a"\nkey_sha256 = "{h}"\nquota = 3\n', "tenant.0.quota"),
        ('[[tenant]]\nname = "Not Valid"\nkey_sha256 = "{h}"\n', "tenant.0.name"),
        ('[[tenant]]\nname = "a"\n', "tenant.0.key_sha256"),
        ('tenants = 1\n[[tenant]]\nname = "a"\nkey_sha256 = "{h}"\n', "tenants"),
        ("", "tenant"),
        ("tenant = []\n", "tenant"),
        ("[[tenant]\n", "-"),
    ],
    ids=["unknown-key", "bad-name", "missing-hash", "unknown-table", "empty", "none", "toml"],
)
def test_a_malformed_tenants_file_is_refused(tmp_path: Path, text: str, key: str) -> None:
    path = tenants_file(tmp_path, text.replace("{h}", hash_key(new_key())))
    with pytest.raises(TenantsFileError) as caught:
        load_tenants_file(path)
    assert caught.value.key == key


def test_tenant_names_and_keys_must_be_unique(tmp_path: Path) -> None:
    key = new_key()
    for text in (entry("a", key) + entry("a", new_key()), entry("a", key) + entry("b", key)):
        with pytest.raises(TenantsFileError) as caught:
            load_tenants_file(tenants_file(tmp_path, text))
        assert caught.value.key == "-"


def test_a_missing_tenants_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TenantsFileError) as caught:
        load_tenants_file(tmp_path / "absent.toml")
    assert caught.value.file.endswith("absent.toml")
    assert caught.value.reason == "file not found"


def test_the_local_key_is_made_once_with_mode_0600_and_then_reused(tmp_path: Path) -> None:
    directory = tmp_path / "data" / "sandhold"
    keys, key, created = local_tenant(directory)
    assert created and keys.tenant_for(key) == LOCAL_TENANT
    path = directory / LOCAL_KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert path.read_text().strip() == key

    again, same_key, created_again = local_tenant(directory)
    assert not created_again and same_key == key and again.tenant_for(key) == LOCAL_TENANT
    assert [p.name for p in directory.iterdir()] == [LOCAL_KEY_FILE]


def test_a_local_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    local_key(tmp_path)
    (tmp_path / LOCAL_KEY_FILE).chmod(0o644)
    with pytest.raises(TenantsFileError) as caught:
        local_key(tmp_path)
    assert "owner only" in caught.value.reason


def test_a_local_key_file_without_a_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / LOCAL_KEY_FILE
    path.write_text("\n")
    path.chmod(0o600)
    with pytest.raises(TenantsFileError):
        local_key(tmp_path)


def test_a_symlinked_local_key_file_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text(new_key())
    target.chmod(0o600)
    (tmp_path / LOCAL_KEY_FILE).symlink_to(target)
    with pytest.raises(TenantsFileError):
        local_key(tmp_path)


def test_the_data_directory_follows_the_environment(tmp_path: Path) -> None:
    assert data_dir({"SANDHOLD_DATA_DIR": "/a", "XDG_DATA_HOME": "/b"}) == Path("/a")
    assert data_dir({"XDG_DATA_HOME": "/b"}) == Path("/b/sandhold")
    assert data_dir({}) == Path.home() / ".local" / "share" / "sandhold"


# -- policies and quotas ------------------------------------------------------------------------


def test_a_tenant_may_list_its_policies_and_quotas(tmp_path: Path) -> None:
    text = entry("team-a", new_key()) + (
        'policies = ["default", "strict"]\n'
        "[tenant.quotas]\n"
        "sessions = 10\n"
        "memory_mb = 8192\n"
        "cpus = 4\n"
        "terminals_per_session = 4\n"
        "processes_per_session = 8\n"
    )
    (tenant,) = load_tenants_file(tenants_file(tmp_path, text)).tenant
    assert tenant.policies == ("default", "strict")
    assert tenant.quotas == TenantQuotas(
        sessions=10,
        memory_mb=8192,
        cpus=4.0,
        terminals_per_session=4,
        processes_per_session=8,
    )


def test_without_policies_or_quotas_a_tenant_has_no_limit_of_its_own(tmp_path: Path) -> None:
    (tenant,) = load_tenants_file(tenants_file(tmp_path, entry("team-a", new_key()))).tenant
    assert tenant.policies is None
    assert tenant.quotas == TenantQuotas()
    assert all(value is None for value in tenant.quotas.model_dump().values())


def test_quotas_belong_to_the_tenant_table_they_follow(tmp_path: Path) -> None:
    text = (
        entry("team-a", new_key())
        + "[tenant.quotas]\nsessions = 1\n"
        + entry("team-b", new_key())
        + "policies = []\n"
    )
    a, b = load_tenants_file(tenants_file(tmp_path, text)).tenant
    assert (a.quotas.sessions, a.policies) == (1, None)
    assert (b.quotas.sessions, b.policies) == (None, ())


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("[tenant.quotas]\nsessionz = 3\n", "tenant.0.quotas.sessionz"),
        ("[tenant.quotas]\nsessions = -1\n", "tenant.0.quotas.sessions"),
        ("[tenant.quotas]\nmemory_mb = -512\n", "tenant.0.quotas.memory_mb"),
        ("[tenant.quotas]\ncpus = -0.5\n", "tenant.0.quotas.cpus"),
        ("[tenant.quotas]\nterminals_per_session = -1\n", "tenant.0.quotas.terminals_per_session"),
        ("[tenant.quotas]\nprocesses_per_session = -1\n", "tenant.0.quotas.processes_per_session"),
        ('[tenant.quotas]\nsessions = "ten"\n', "tenant.0.quotas.sessions"),
        ('policies = ["no spaces"]\n', "tenant.0.policies.0"),
        ('policies = "default"\n', "tenant.0.policies"),
    ],
    ids=[
        "unknown-quota",
        "negative-sessions",
        "negative-memory",
        "negative-cpus",
        "negative-terminals",
        "negative-processes",
        "not-a-number",
        "bad-policy-name",
        "policies-not-a-list",
    ],
)
def test_a_malformed_policy_list_or_quota_is_refused_naming_the_key(
    tmp_path: Path, extra: str, key: str
) -> None:
    path = tenants_file(tmp_path, entry("team-a", new_key()) + extra)
    with pytest.raises(TenantsFileError) as caught:
        load_tenants_file(path)
    assert caught.value.key == key
    assert caught.value.to_dict()["error_type"] == "invalid_argument"


def test_an_unknown_quota_is_reported_as_an_unknown_key(tmp_path: Path) -> None:
    path = tenants_file(tmp_path, entry("team-a", new_key()) + "[tenant.quotas]\ngpus = 1\n")
    with pytest.raises(TenantsFileError) as caught:
        load_tenants_file(path)
    assert caught.value.reason == "unknown key"


def test_the_data_directory_of_the_old_name_is_moved_once_and_kept(tmp_path: Path) -> None:
    from orchestrator._core.data_dir import LEGACY_DATA_DIR_NAME, migrate_legacy_data_dir

    legacy = tmp_path / LEGACY_DATA_DIR_NAME
    legacy.mkdir()
    (legacy / "registry.db").write_text("kept")
    env = {"XDG_DATA_HOME": str(tmp_path)}
    assert migrate_legacy_data_dir(env) == tmp_path / "sandhold"
    assert (tmp_path / "sandhold" / "registry.db").read_text() == "kept"
    assert not legacy.exists()
    legacy.mkdir()  # an old one appearing again beside the new one is left alone
    assert migrate_legacy_data_dir(env) is None
    assert migrate_legacy_data_dir({**env, "SANDHOLD_DATA_DIR": str(tmp_path / "x")}) is None

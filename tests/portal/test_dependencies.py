"""The packages the code imports are the packages pyproject.toml declares, each where it is used: the portal's own
dependencies for the portal, the `agent` extra for the node agent, the `sim` extra for the simulator."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OURS = {"portal", "quotas", "scheduling", "agent", "frontend", "cli", "demo", "bench", "tests"}
# Used when the host has it, never required: the MPS smoke test allocates GPU memory with torch where it is
# installed (agent/mps_probe.py) and reports without it.
USED_WHEN_PRESENT = {"torch"}


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}

    extras = {k: names(v) for k, v in project["optional-dependencies"].items()}
    return names(project["dependencies"]), extras


def _imports(paths: list[Path]) -> dict[str, str]:
    """Top-level module imported (at any level of the file, function bodies included) -> the first file doing so."""
    found: dict[str, str] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def _distributions(modules: dict[str, str]) -> dict[str, str]:
    """Third-party modules -> their distribution (lower case), with the file that imports them."""
    owners = packages_distributions()
    out = {}
    for module, where in modules.items():
        if module in OURS or module in USED_WHEN_PRESENT or module in sys.stdlib_module_names:
            continue
        dists = owners.get(module)
        assert dists, f"{where} imports {module!r}, which no installed distribution provides"
        out[dists[0].lower().replace("_", "-")] = f"{module} ({where})"
    return out


def _files(*packages: str, exclude: tuple[str, ...] = ()) -> list[Path]:
    return [
        p
        for pkg in packages
        for p in (ROOT / pkg).rglob("*.py")
        if "migrations" not in p.parts and not any(p.is_relative_to(ROOT / e) for e in exclude)
    ]


# Distributions that come with a declared one (celery[redis] brings kombu, Django brings asgiref, DRF's schema
# needs uritemplate...) are declared by that one: they may be imported where it is.
TRANSITIVE = {
    "asgiref": "django",
    "kombu": "celery",
    "twisted": "daphne",
    "msgpack": "channels-redis",
    "python-ldap": "django-auth-ldap",
}
# The LDAP sign-in's modules: imported only when TESSERA_LDAP_URI is set, from the `ldap` extra.
LDAP_MODULES = ("quotas/ldap.py", "quotas/ldap_settings.py")


def _undeclared(used: dict[str, str], allowed: set[str]) -> list[str]:
    return sorted(
        f"{dist}: {what}" for dist, what in used.items() if TRANSITIVE.get(dist, dist) not in allowed
    )


def test_the_portal_imports_only_its_declared_dependencies() -> None:
    core, _ = _declared()
    used = _distributions(
        _imports(
            _files("portal", "quotas", "scheduling", "frontend", exclude=("scheduling/sim", *LDAP_MODULES))
        )
    )
    assert not _undeclared(used, core), "imported by the portal but not in [project] dependencies"
    assert "numpy" in used  # the engine's node index: a declared dependency, not a matplotlib passenger


def test_the_agent_and_the_simulator_import_only_the_portal_s_dependencies_and_their_extra() -> None:
    core, extras = _declared()
    agent = _distributions(_imports(_files("agent")))
    sim = _distributions(_imports(_files("scheduling/sim")))
    assert not _undeclared(agent, core | extras["agent"]), (
        "the agent imports what neither core nor [agent] has"
    )
    assert not _undeclared(sim, core | extras["sim"]), "the simulator imports what neither core nor [sim] has"
    assert {"nvidia-ml-py", "websockets"} <= set(agent)
    assert {"matplotlib", "tqdm"} <= set(sim)
    ldap = _distributions(_imports([ROOT / m for m in LDAP_MODULES]))
    assert not _undeclared(ldap, core | extras["ldap"]), (
        "the LDAP sign-in imports what neither core nor [ldap] has"
    )
    assert {"django-auth-ldap", "python-ldap"} <= set(ldap)


def test_the_portal_s_own_dependencies_leave_the_agent_s_and_simulator_s_to_their_extras() -> None:
    core, extras = _declared()
    # websockets is the portal's too: the session proxy's client to a job's port (frontend/sessions.py).
    assert not core & {"matplotlib", "tqdm", "nvidia-ml-py"} and "websockets" in core
    assert {"nvidia-ml-py", "websockets"} <= extras["agent"] and {"matplotlib", "tqdm"} <= extras["sim"]
    assert any("tessera[" in r and "agent" in r and "sim" in r for r in _raw_dev())  # `make install` has both


def _raw_dev() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]


def test_the_image_copies_every_package_the_install_ships() -> None:
    shipped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = {pattern.rstrip("*") for pattern in shipped["include"]}
    copied = set(re.findall(r"^COPY (\w+) \./\1$", (ROOT / "Dockerfile").read_text(), re.MULTILINE))
    assert packages == copied, f"the Dockerfile copies {sorted(copied)}, the install ships {sorted(packages)}"


def _locked() -> dict[str, str]:
    """Distribution (normalised) -> the version requirements.lock pins."""
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            name, version = line.split(";")[0].strip().split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_the_lock_pins_every_dependency_pyproject_declares_at_a_version_it_allows() -> None:
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [
        *project["dependencies"],
        *(r for extra in project["optional-dependencies"].values() for r in extra),
    ]
    pins = _locked()
    problems = []
    for text in declared:
        req = Requirement(text)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name == "tessera":
            continue  # the dev extra naming the project's own extras
        if name not in pins:
            problems.append(f"{text}: not in requirements.lock")
        elif not req.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{text}: the lock pins {pins[name]}")
    assert not problems, "requirements.lock is stale; regenerate it (its first lines say how): " + "; ".join(
        problems
    )


def test_the_lock_says_how_it_was_made_from_pyproject() -> None:
    head = (ROOT / "requirements.lock").read_text().splitlines()[:2]
    assert "uv pip compile pyproject.toml --all-extras" in head[1] and "-o requirements.lock" in head[1]

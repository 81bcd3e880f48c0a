"""JUnit XML of a ``sandhold policy test`` run, for CI systems: one ``testsuite`` per case file, one
``testcase`` per case and policy (``name [policy]``), a ``failure`` for a mismatch, an ``error``
for a case that could not run, ``skipped`` for a policy not under test. Each suite carries the
hash of every policy under test, so a report says exactly which policy it proved."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrator.policy.model import Policy
from orchestrator.policy_ci.runner import CaseReport, CaseRun

__all__ = ["junit_xml", "write_junit"]

SUITE_PREFIX = "sandhold-policy-test"


def junit_xml(
    reports: Sequence[CaseReport],
    skipped: Sequence[CaseRun],
    policies: Mapping[str, Policy],
    *,
    seconds: float | None = None,
) -> str:
    """The report; ``seconds`` is the run's wall time (cases overlap, so their sum is more)."""
    root = ET.Element("testsuites", name=SUITE_PREFIX)
    suites: dict[str, ET.Element] = {}
    for report in reports:
        suite = _suite(root, suites, report.run, policies)
        case = _testcase(suite, report.run, report.seconds)
        if report.status in ("fail", "error"):
            tag = "failure" if report.status == "fail" else "error"
            element = ET.SubElement(case, tag, message=report.detail, type=report.status)
            element.text = _details(report)
    for run in skipped:
        suite = _suite(root, suites, run, policies)
        case = _testcase(suite, run, 0.0)
        ET.SubElement(case, "skipped", message=f"policy {run.policy!r} is not under test")
    for element in [root, *suites.values()]:
        _count(element)
    if seconds is not None:
        root.set("time", f"{seconds:.3f}")
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _suite(
    root: ET.Element,
    suites: dict[str, ET.Element],
    run: CaseRun,
    policies: Mapping[str, Policy],
) -> ET.Element:
    name = run.spec.suite
    if name not in suites:
        suite = ET.SubElement(root, "testsuite", name=f"{SUITE_PREFIX}.{name}")
        properties = ET.SubElement(suite, "properties")
        ET.SubElement(properties, "property", name="file", value=str(run.spec.file))
        for policy_name, policy in sorted(policies.items()):
            ET.SubElement(
                properties, "property", name=f"policy.{policy_name}.hash", value=policy.hash
            )
        suites[name] = suite
    return suites[name]


def _testcase(suite: ET.Element, run: CaseRun, seconds: float) -> ET.Element:
    return ET.SubElement(
        suite,
        "testcase",
        classname=f"{SUITE_PREFIX}.{run.spec.suite}",
        name=run.label,
        time=f"{seconds:.3f}",
    )


def _details(report: CaseReport) -> str:
    case = report.run.spec.case
    return "\n".join(
        [
            f"{case.kind}: {case.operation_text}",
            f"expected: {report.expected}",
            f"got:      {report.got}",
            f"rule:     {report.rule}",
            f"why:      {report.detail}",
            f"where:    {report.run.spec.where}",
        ]
    )


def _count(element: ET.Element) -> None:
    cases = list(element.iter("testcase"))
    element.set("tests", str(len(cases)))
    for tag, attribute in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
        element.set(attribute, str(sum(1 for c in cases if c.find(tag) is not None)))
    element.set("time", f"{sum(float(c.get('time', '0')) for c in cases):.3f}")

#!/usr/bin/env python3
"""Lints the Helm chart and renders it to plain manifests, as `helm lint
--strict` and `helm template` would.

    deploy/render.py > deploy/manifests/radixgate.yaml     # regenerate
    deploy/render.py --set-json '{"discovery": {"allNamespaces": true}}'
    deploy/render.py --notes                               # NOTES.txt only

It uses Helm's own Go SDK (chart loading, the template engine and the
linter), which the PyPI package helm-python-sdk ships as a native library:
`pip install helm-python-sdk==0.2.2` (.ci/run installs it). A lint finding
of warning level or worse, or a template that fails, exits 1 with the
message on stderr; the manifests go to stdout, one document per object,
ordered by kind so that what an object needs is created before it.
"""

import argparse
import json
import os
import sys

import helm_python as helm

CHART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helm", "radixgate")

# The order `kubectl apply -f` creates them in: identities, configuration
# and permissions before the pods that use them.
KIND_ORDER = [
    "ServiceAccount",
    "ConfigMap",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Service",
    "Deployment",
    "PodDisruptionBudget",
    "ServiceMonitor",
]

HEADER = """\
# radixgate's plain Kubernetes manifests: the Helm chart deploy/helm/radixgate
# rendered with its default values (release radixgate, namespace default).
# Generated: do not edit. Change the chart and regenerate with
#   deploy/render.py > deploy/manifests/radixgate.yaml
# (a test fails while this file and the chart disagree).
"""


def kind_of(document):
    for line in document.splitlines():
        if line.startswith("kind:"):
            return line.split(":", 1)[1].strip()
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set-json", default="{}", help="values over the chart's, as a JSON object")
    parser.add_argument("--name", default="radixgate", help="release name")
    parser.add_argument("--namespace", default="default", help="release namespace")
    parser.add_argument("--notes", action="store_true", help="print the rendered NOTES.txt only")
    args = parser.parse_args()
    values = json.loads(args.set_json)

    report = helm.lint(CHART, values, strict=True, namespace=args.namespace)
    findings = [m for m in report["messages"] if m["severity"] >= 2] + [
        {"path": "", "error": e} for e in report["errors"]
    ]
    if findings:
        for f in findings:
            print(f"helm lint: {f['path']}: {f['error']}", file=sys.stderr)
        return 1

    try:
        with helm.Chart.load(CHART) as chart:
            rendered = chart.render(values, name=args.name, namespace=args.namespace, is_install=True)
    except helm.HelmError as err:
        print(f"helm template: {err}", file=sys.stderr)
        return 1

    if args.notes:
        notes = [text for path, text in rendered.items() if path.endswith("/NOTES.txt")]
        sys.stdout.write("".join(notes))
        return 0

    documents = []
    for path, text in sorted(rendered.items()):
        name = os.path.basename(path)
        if name.startswith("_") or name == "NOTES.txt":
            continue
        for document in text.split("\n---\n"):
            document = document.strip("\n")
            if not document.strip():
                continue
            kind = kind_of(document)
            if kind not in KIND_ORDER:
                print(f"render: {path}: kind {kind!r} is not in KIND_ORDER", file=sys.stderr)
                return 1
            documents.append((KIND_ORDER.index(kind), path, document))
    documents.sort(key=lambda d: (d[0], d[1]))

    out = [HEADER if args.set_json == "{}" and args.name == "radixgate" and args.namespace == "default" else ""]
    for _, source, document in documents:
        out.append(f"---\n# Source: {source}\n{document}\n")
    sys.stdout.write("".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

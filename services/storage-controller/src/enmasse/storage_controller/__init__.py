"""The storage-controller: declared store-and-forward addresses -> brokers (DESIGN §3).

`placement` decides which broker holds which address (pure), `workloads` renders those brokers as
Kubernetes manifests into the GitOps output and reads them back for the local runtime (pure plus
a small file writer), `statuses` says what each Address status must read (pure), `controller`
runs the reconcile loop against the config service and the brokers' BrokerAdmin (found through
the `Directory` of `enmasse.resources.discovery`), and `main` wires it up.
"""

"""The local runtime: the whole system on one machine, under supervisord (`enmasse up/down/status`).

What runs: a real etcd (/usr/bin/etcd, data under <var>/etcd), the config service, the
storage-controller, the router-agent and the subscription service (the latter three rendering
and reading the GitOps output in <var>/gitops), and `runtime`: the loop that turns the router and
broker workloads rendered there into more programs, added and removed live. Each is a
`[program:x]` of one supervisord, driven over its XML-RPC API on a unix socket. The services are
started as processes (their console scripts), never imported.

The parts, from the ground up:
- `var_dir`: where one installation keeps its state, logs and sockets (./var by default);
- `ports`: the control plane's loopback ports, chosen free once and kept in <var>/ports.json;
- `tls`: the CAs and every process's certificate in <var>/tls (every gRPC port is mutual TLS);
- `programs`: the control plane's command lines and the supervisord config that runs them;
- `supervisor`: starting supervisord, changing its programs live, finding what is ours by PID;
- `stack`: `up`, `down` and `status` of the whole system, one at a time per var dir;
- `runtime`: the reconcile loop (`enmasse runtime reconcile`, itself a supervised program) from
  rendered workloads to supervisor programs.
"""

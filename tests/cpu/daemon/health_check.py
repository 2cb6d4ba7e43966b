#!/usr/bin/env python3
"""health_check.py: query mkerneld's grpc.health.v1 service with the reference Python client.

An independent check of what mkerneldctl reports, using grpcio + grpcio-health-checking.

Exit codes: 0 every queried service SERVING, 1 any NOT_SERVING or unknown, 2 unreachable,
3 usage error (including missing Python packages).

Examples:
  health_check.py --runtime-dir /tmp/mk1                 # "" and every mkerneld.gpu<N>
  health_check.py --socket /run/mkerneld/admin.sock --service mkerneld.gpu1
"""
import argparse
import os
import sys

try:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"health_check: needs grpcio and grpcio-health-checking: {e}", file=sys.stderr)
    sys.exit(3)

MAX_GPUS = 64  # per-GPU services are probed from gpu0 until the first unknown one


def check(stub, service, timeout):
    """Returns 'SERVING', 'NOT_SERVING', 'UNKNOWN' or 'SERVICE_UNKNOWN'; raises grpc.RpcError."""
    try:
        resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:
            return "SERVICE_UNKNOWN"
        raise
    return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--runtime-dir", default="/run/mkerneld",
                       help="the admin socket is DIR/admin.sock "
                            "(default %(default)s)")
    where.add_argument("--socket", help="path of the admin Unix socket")
    where.add_argument("--address", help="gRPC target, e.g. unix:/path (plaintext only)")
    ap.add_argument("--service", action="append",
                    help="check only this service ('' = whole server); repeatable")
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds per call")
    try:
        args = ap.parse_args()
    except SystemExit as e:
        sys.exit(0 if e.code == 0 else 3)

    if args.address:
        target = args.address
    elif args.socket:
        target = "unix:" + args.socket
    else:
        base = args.runtime_dir.rstrip("/")
        names = ["admin.sock"]  # as mkerneldctl
        found = [n for n in names if os.path.exists(f"{base}/{n}")]
        target = f"unix:{base}/{(found or names)[0]}"

    results = []
    try:
        with grpc.insecure_channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            if args.service is not None:
                for name in args.service:
                    results.append((name, check(stub, name, args.timeout)))
            else:
                results.append(("", check(stub, "", args.timeout)))
                for gpu in range(MAX_GPUS):
                    name = f"mkerneld.gpu{gpu}"
                    status = check(stub, name, args.timeout)
                    if status == "SERVICE_UNKNOWN":
                        break
                    results.append((name, status))
    except grpc.RpcError as err:
        print(f"health_check: cannot reach mkerneld at {target}: {err.code().name}: "
              f"{err.details()}", file=sys.stderr)
        return 2

    for name, status in results:
        print(f"{name or '(server)'}\t{status}")
    return 0 if all(status == "SERVING" for _, status in results) else 1


if __name__ == "__main__":
    sys.exit(main())

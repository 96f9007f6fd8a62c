# etcd or Prometheus for tests/deploy/test_compose_cluster.py: the program of the Debian package
# (etcd-server, prometheus; what CI installs with apt) on the local Debian base, run as nobody.
# The context holds the program alone; its data folders are made here, owned by nobody, so the
# named volumes compose mounts on them start with that owner.
ARG BASE
FROM ${BASE}
ARG PROGRAM
COPY ${PROGRAM} /usr/local/bin/${PROGRAM}
RUN mkdir -p /etcd-data /prometheus && chown 65534:65534 /etcd-data /prometheus \
    && chmod 0700 /etcd-data
USER 65534:65534
WORKDIR /prometheus

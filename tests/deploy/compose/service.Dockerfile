# etcd or Prometheus for tests/deploy/test_compose_cluster.py: the files of the Debian package
# (etcd-server, prometheus; what CI installs with apt) on the local Debian base, run as nobody.
# The context holds those files under root/ (composekit.build_images); the data folders are
# made here, owned by nobody, so the named volumes compose mounts on them start with that owner.
ARG BASE
FROM ${BASE}
COPY root/ /
RUN mkdir -p /etcd-data /prometheus && chown 65534:65534 /etcd-data /prometheus \
    && chmod 0700 /etcd-data
USER 65534:65534
WORKDIR /prometheus

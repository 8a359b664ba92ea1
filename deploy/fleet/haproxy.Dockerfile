# The fleet's load balancer: Debian's haproxy (2.6 on bookworm) on the same base image as the server's, so a
# build that reaches only a registry mirror and a Debian mirror needs nothing more (docker/README.md):
#   docker build -f deploy/fleet/haproxy.Dockerfile -t bertserve-lb:haproxy deploy/fleet
#   docker build --build-arg BASE_IMAGE=registry.example.com/library/python:3.11-slim-bookworm ...
# Any haproxy >= 2.0 image works instead (BERTSERVE_LB_IMAGE in docker-compose.yml): the config is
# mounted and named on the command line there.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
# Not pinned: the version is whatever the base's Debian release ships (2.6 on bookworm), security fixes included.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends haproxy \
    && rm -rf /var/lib/apt/lists/* \
    && haproxy -v
# nobody: the port inside (8080) needs no privileges, the mounted configuration is world-readable.
USER 65534:65534
EXPOSE 8080
STOPSIGNAL SIGUSR1
CMD ["haproxy", "-W", "-db", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]

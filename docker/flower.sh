#!/bin/sh
# Flower in a container (the image's `sluice-flower`): refuses to start unauthenticated unless it is
# published on loopback only.
#   FLOWER_BASIC_AUTH   user:password[,user2:password2]: Flower asks for it on every page and API call
#   PUBLISHED_ON        where the port is published (compose: host address and port, such as
#                       127.0.0.1:5555); unset means anywhere (Kubernetes: the whole cluster)
# Flower turns every FLOWER_* variable into an option and treats an empty FLOWER_BASIC_AUTH as a
# password nobody has, so an empty one is removed rather than passed on.
set -eu
if [ -z "${FLOWER_BASIC_AUTH:-}" ]; then
  unset FLOWER_BASIC_AUTH
  case "${PUBLISHED_ON:-}" in
    127.*:*|localhost:*|\[::1\]:*) ;;
    *)
      echo "sluice-flower: published on '${PUBLISHED_ON:-any address}', beyond loopback:" \
           "set FLOWER_BASIC_AUTH=user:password" >&2
      exit 2
      ;;
  esac
fi
exec sluice flower --port 5555 --address 0.0.0.0 "$@"

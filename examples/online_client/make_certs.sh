#!/bin/sh
# The certificates of msprobe's TLS transport, in its tls_path layout, made with the openssl command line:
# ca.crt (the CA both sides trust), server.key/server.crt (pytest's side), client.key/client.crt (the
# training side). One folder holds both here; on two hosts, copy ca.crt + client.* to the training host and
# ca.crt + server.* to the checking host. Keys are unencrypted; ca.key signs, keep it off both hosts.
#   sh make_certs.sh [FOLDER]        (default ./certs)
set -eu
out="${1:-certs}"
mkdir -p "$out"
cd "$out"
cat > ext.cnf <<'CNF'
[req]
distinguished_name=dn
[dn]
[ca]
basicConstraints=critical,CA:true
keyUsage=critical,keyCertSign,cRLSign
[server]
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
[client]
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
CNF
# 1. the CA: a self-signed certificate that may sign others
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 365 -subj /CN=msprobe-online-ca \
    -extensions ca -config ext.cnf
for who in server client; do
    # 2. a key, 3. a signing request, 4. the certificate the CA signs (serverAuth or clientAuth)
    openssl genrsa -out "$who.key" 2048
    openssl req -new -key "$who.key" -subj "/CN=$who" -out "$who.csr" -config ext.cnf
    openssl x509 -req -in "$who.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
        -extfile ext.cnf -extensions "$who" -out "$who.crt"
done
rm -f server.csr client.csr
chmod 600 ./*.key
echo "made $(pwd): ca.crt server.key server.crt client.key client.crt (and ca.key, which signed them)"

"""Every size and count bound of the mesh wire protocol and tables, each with the reason for its value.

Time bounds that operators tune live in :class:`mesh.config.MeshConfig`; the constants here are protocol
facts that both ends must agree on, or memory guards against a hostile or buggy peer.
"""

from __future__ import annotations

from typing import Final

# -- wire format ------------------------------------------------------------------------------------------

#: First byte of every packet and stream frame (WireVersion in proto/mesh.proto). Bump only for an
#: incompatible change; within a version, message types are append-only and protobuf fields may only be
#: added (decoders skip unknown fields), so older nodes keep decoding what they know. 1 was the hand-written
#: bodies of smg-node 0.1; 2 is protobuf bodies: a node of one does not read the other.
PROTOCOL_VERSION: Final = 2

#: Largest UDP payload we send or accept: a 1,500-byte Ethernet MTU minus IPv6 (40) and UDP (8) headers,
#: less a margin for tunnels/VXLAN, so probes are never IP-fragmented (memberlist's udpSendBuf).
MAX_PACKET_BYTES: Final = 1400

#: A stream (TCP) frame header: version (1) + message type (1) + payload length (u32, 4).
STREAM_HEADER_BYTES: Final = 6

#: Largest stream frame payload: a push-pull of MAX_MEMBERS members (~0.8 KB each at most) plus the
#: delegate's state must fit, while one connection cannot make us buffer without bound.
MAX_STREAM_FRAME_BYTES: Final = 16 * 1024 * 1024

#: Largest opaque delegate state carried by push-pull (the CRDT document of the cluster state); a few MB
#: is far above the single-writer-row design's expected ~100 KB.
MAX_USER_STATE_BYTES: Final = 4 * 1024 * 1024

#: AES-GCM nonce length (96 bits, the size GCM is specified for).
NONCE_BYTES: Final = 12

#: AES-GCM authentication tag length.
TAG_BYTES: Final = 16

#: Bytes an encrypted packet adds around its plaintext: the ENCRYPTED type byte, nonce and tag.
ENCRYPTION_OVERHEAD: Final = 1 + NONCE_BYTES + TAG_BYTES

#: Plaintext bytes per sealed chunk of a large encrypted stream frame (ENCRYPTED_CHUNKS). A receiver reads
#: and authenticates the first chunk before it accepts more, so a stranger without the key makes it hold at
#: most one sealed chunk per stream. 64 KiB holds the push-pull of ~80 members: most frames are one chunk.
STREAM_SEAL_CHUNK_BYTES: Final = 64 * 1024

#: What an inbound stream may send before it is authenticated: one sealed chunk (a small encrypted frame is
#: sealed whole, as one such chunk, so older nodes still read it).
MAX_PREAUTH_BYTES: Final = STREAM_SEAL_CHUNK_BYTES + NONCE_BYTES + TAG_BYTES

#: Compound message header: type byte + part count byte.
COMPOUND_HEADER_BYTES: Final = 2

#: Per part overhead inside a compound message: a u16 length prefix.
COMPOUND_PART_OVERHEAD: Final = 2

#: Most parts in one compound message (the count is one byte on the wire; 64 small messages already fill
#: a packet, so a larger count can only come from a malformed or hostile packet).
MAX_COMPOUND_PARTS: Final = 64

#: Bytes before a user message's payload in a packet: its type byte, the protobuf field tag (1) and the
#: payload's varint length (2 up to 16,383 bytes, above MAX_USER_MSG_BYTES).
USER_MSG_HEADER_BYTES: Final = 4

# -- identity and metadata --------------------------------------------------------------------------------

#: Node names: DNS-label-ish identifiers; bounded so that an alive message always fits a packet.
MAX_NAME_BYTES: Final = 128

#: "host:port" for IPv4 or bracketed IPv6 ("[ffff:...]:65535" is 47 characters); room for a DNS name.
MAX_ADDR_BYTES: Final = 128

#: Encoded member metadata (HTTP address, version, roles). 512 B keeps an alive message (name + address +
#: metadata + 10 B of header) under half a packet, so it can always ride on a probe or an ack.
MAX_META_BYTES: Final = 512

#: Each metadata string (HTTP address, version, role key and value): the u8 length of the first wire format,
#: kept as the bound so that MAX_META_BYTES's accounting is unchanged.
MAX_META_STRING_BYTES: Final = 255

#: Roles per member: a small label set, not a database.
MAX_ROLES: Final = 16

#: Largest user (delegate) broadcast that can ride in a packet next to a ping and its headers.
MAX_USER_MSG_BYTES: Final = 1024

#: One member of a push-pull, encoded: name and address (128 B each), metadata (MAX_META_BYTES plus at most
#: ~120 B of protobuf tags and lengths for 16 roles), incarnation, state and tags: under 920 B. Checked before
#: protobuf parses a push-pull, so members cannot carry unbounded unknown fields.
MAX_PUSH_PULL_MEMBER_BYTES: Final = 1024

# -- tables and queues ------------------------------------------------------------------------------------

#: Most members one node tracks (and accepts in a push-pull). Far above the intended cluster sizes
#: (tens to a few hundred), low enough that a hostile push-pull cannot exhaust memory.
MAX_MEMBERS: Final = 10_000

#: Most queued membership broadcasts; beyond it the oldest, most retransmitted ones are dropped. A queue
#: only grows this large during a mass join, where push-pull repairs whatever gossip drops.
MAX_BROADCAST_QUEUE: Final = 4096

#: Most outstanding ack handlers (our probes plus indirect probes we relay). Bounds the state a flood of
#: ping-req messages can make us hold; beyond it, new relay requests are dropped.
MAX_PENDING_ACKS: Final = 1024

#: Most failed members remembered for periodic reconnect attempts after they are reaped from the table.
MAX_FAILED_REMEMBERED: Final = 1024

#: Sequence numbers and incarnations are u32 on the wire.
MAX_U32: Final = 0xFFFF_FFFF

#: Push-pull interval scaling kicks in above this many members (memberlist's pushPullScaleThreshold), so
#: full-state exchange cost per node stays bounded as the cluster grows.
PUSH_PULL_SCALE_THRESHOLD: Final = 32

# -- inbound streams (memory a stranger can make us hold before we know who it is) -------------------------

#: Inbound streams served at once, in total. A stream is one request (join, push-pull, fallback ping) and
#: lasts milliseconds; even 200 members joining through one seed at once only retry (join backs off), while
#: a flood of connections holds at most this many handlers and their read buffers.
MAX_INBOUND_STREAMS: Final = 64

#: Inbound streams served at once from one peer address. A member has at most a push-pull and a fallback
#: ping in flight to us; several processes of one host (serve --processes N) share an address.
MAX_INBOUND_STREAMS_PER_HOST: Final = 8

#: Frame bytes all inbound streams together may hold while a frame is being read. Two frames of the largest
#: size fit (a push-pull of a big cluster arriving while another is read); a flood of streams announcing
#: large frames is refused once it is reached, instead of buffering MAX_STREAM_FRAME_BYTES per connection.
#: The whole frame is then joined once, so the transient peak is about twice this.
MAX_INBOUND_BUFFER_BYTES: Final = 2 * MAX_STREAM_FRAME_BYTES

#: A stream frame's body is read (and accounted against MAX_INBOUND_BUFFER_BYTES) in pieces of this size,
#: so a connection holds no more than it has actually sent.
STREAM_READ_CHUNK_BYTES: Final = 64 * 1024

#: The frame header and the first MAX_PREAUTH_BYTES of the payload (what authenticates the stream) must
#: arrive this soon after the connection is accepted: a member writes its whole request at once, 64 KiB take
#: milliseconds on a LAN and well under a second on a WAN link, so only an idle or hostile connection takes
#: longer (capped by tcp_timeout_s).
STREAM_PREAUTH_TIMEOUT_S: Final = 2.0

#: With mesh TLS, the handshake must finish this soon after the connection is accepted (capped by
#: tcp_timeout_s). The connection counts against MAX_INBOUND_STREAMS(_PER_HOST) meanwhile, so half-done
#: handshakes hold at most that many sockets for this long. TLS 1.3 needs one round trip and a signature
#: on each side: milliseconds on a LAN, well under a second across regions.
TLS_HANDSHAKE_TIMEOUT_S: Final = 3.0

#: At most one log line per this many seconds for each kind of refused input (streams refused, malformed
#: packets, implausible incarnations); the counters in MeshMetrics count every one.
REFUSAL_LOG_INTERVAL_S: Final = 10.0

# -- incarnations ---------------------------------------------------------------------------------------------

#: Largest step by which a message may raise the incarnation we know of a member (ourselves included). Only
#: the member itself raises it, by one per refutation or metadata change, so a real message is a few steps
#: ahead of our view; a larger jump can only be forged, and would leave the member unable to out-bid it
#: (incarnations are u32). Walking a member to the top takes 2**32 / this many accepted messages instead of one.
MAX_INCARNATION_JUMP: Final = 1 << 16

#: Largest incarnation an accusation (suspect, dead) may name, so that the accused can always refute it with
#: a higher one (a refutation is the accused incarnation + 1; above MAX_U32 there is none).
MAX_ACCUSED_INCARNATION: Final = MAX_U32 - 1

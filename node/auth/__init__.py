"""Who is calling: API keys (and later JWT), roles, and the per-identity limits the mesh enforces.

Pure cores here (key format and hashing, identities and route rules); the replicated key table lives in
node/cluster/api_keys.py (only node/cluster touches the mesh state) and the HTTP shell in
node/http/auth_middleware.py.
"""

package client

// MaxQuotaKeys is maxQuotaKeys, for the test that keeps it the node's.
const MaxQuotaKeys = maxQuotaKeys

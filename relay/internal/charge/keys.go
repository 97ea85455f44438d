package charge

// messageKey returns the store key for messages of type typ from client:
// "{client}:message:TYPE". The client is in braces so that a store which
// shards by key keeps everything of one client together (a Redis Cluster
// hash tag). Subjects build it once per connection.
func messageKey(client, typ string) string {
	return "{" + client + "}:message:" + typ
}

// connectionKey returns the store key for connections from client.
func connectionKey(client string) string {
	return "{" + client + "}:connection"
}

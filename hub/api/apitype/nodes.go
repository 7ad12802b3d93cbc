package apitype

// NodeLabelRequest is the body of POST /v1/nodes/labels: which nodes (by
// name, or by a selector on their hub-set labels; one of the two), and
// the change to their hub-set labels.
type NodeLabelRequest struct {
	Nodes    []string          `json:"nodes,omitempty"`
	Selector string            `json:"selector,omitempty"`
	Set      map[string]string `json:"set,omitempty"`
	Remove   []string          `json:"remove,omitempty"`
}

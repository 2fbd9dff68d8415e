package openai

// ModelList is the body of GET /v1/models. Structs (not maps) keep the
// field order fixed.
type ModelList struct {
	Object string  `json:"object"` // "list"
	Data   []Model `json:"data"`
}

// Model is one model of a ModelList, and the body of GET /v1/models/{id}.
type Model struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // "model"
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

package apitype

import "time"

// Service is a service tunnel as the API shows it.
type Service struct {
	Name string `json:"name"`
	// Target is the node whose Port the service reaches, as this hub names
	// it when the service was created here, as its origin hub names it
	// otherwise (Origin says which).
	Target     string           `json:"target"`
	Port       uint16           `json:"port"`
	Origin     string           `json:"origin"`
	Local      bool             `json:"local"` // created at this hub
	Generation int64            `json:"generation"`
	Bindings   []ServiceBinding `json:"bindings"`
	CreatedBy  string           `json:"created_by,omitempty"`
	CreatedAt  time.Time        `json:"created_at"`
	UpdatedAt  time.Time        `json:"updated_at"`
}

// ServiceBinding is one consumer of a service.
type ServiceBinding struct {
	Consumer  string    `json:"consumer"`
	LocalPort uint16    `json:"local_port"`
	CreatedBy string    `json:"created_by,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// ServiceExposeRequest is the body of POST /v1/services.
type ServiceExposeRequest struct {
	Name   string `json:"name"`
	Target string `json:"target"`
	Port   uint16 `json:"port"`
}

// ServiceConnectRequest is the body of POST /v1/services/{name}/bindings.
type ServiceConnectRequest struct {
	Consumer  string `json:"consumer"`
	LocalPort uint16 `json:"local_port"`
}

package kube

import (
	"github.com/infergate/infergate/xds/weightsink"
)

var _ = weightsink.NewKube
